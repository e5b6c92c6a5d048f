//! Runnable embedding examples for the hpp crates; see the files in this directory.
