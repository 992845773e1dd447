//! Channels (being written).
