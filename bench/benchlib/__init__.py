"""memshim's benchmark harness (stdlib only). Entry point: bench/harness.py."""
