//! Empty: this package only pins the sources bench/benchlib/anchors.py builds.
