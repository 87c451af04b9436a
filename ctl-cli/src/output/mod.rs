//! What the CLI writes and how it looks: stdout, stderr and safe text
//! (print.rs), sizes, tables and sparklines (render.rs), and the timeline
//! chart of `record` and `watch` (timeline.rs).

pub mod print;
pub mod render;
pub mod timeline;
