//! The model library: the models on this machine, and pulling more from Hugging Face.
pub mod pull;
