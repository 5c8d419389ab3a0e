//! End-to-end tests of the HTTP API on a real socket.

mod attachments;
mod auth;
mod cancel;
mod common;
mod compaction;
mod connections;
mod context;
mod conversations;
mod cors;
mod events;
mod limits;
mod messages;
mod ops;
mod reads;
mod robustness;
mod sessions;
mod tls;
mod walkthrough;
