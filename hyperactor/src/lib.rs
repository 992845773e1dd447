#![doc = include_str!("../README.md")]

pub mod channel;
