//! Render engine (see the render issue).
pub mod context;
