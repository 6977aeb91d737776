//! Integration tests live in `integration/`.

/// The README's Rust examples ("Use the layer in your own Lambda"), compiled as doc tests.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
pub struct ReadmeExamples;
