//! Where the crate meets its process: the functions' configuration, read from the environment
//! once at init and refused naming the variable ([`config`]), and the wiring that builds each
//! function's processor, API, relay or receiver with its real adapters ([`bootstrap`]).
//!
//! May use: every other folder (this is the top floor; nothing uses it back).

pub mod bootstrap;
pub mod config;
