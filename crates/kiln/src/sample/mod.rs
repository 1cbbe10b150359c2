//! Placeholder until the sampler module lands (interface only).
#![allow(dead_code, unused_variables)]
use crate::error::Result;
#[non_exhaustive]
#[derive(Clone, Debug, Default)]
pub struct SamplerParams {
    pub temp: f32,
    pub top_k: i32,
    pub top_p: f32,
    pub min_p: f32,
    pub typical_p: f32,
    pub repeat_penalty: f32,
    pub repeat_last_n: i32,
    pub presence_penalty: f32,
    pub frequency_penalty: f32,
    pub logit_bias: Vec<(u32, f32)>,
    pub seed: Option<u64>,
}
impl SamplerParams {
    pub fn validate(&self, n_vocab: usize) -> Result<()> {
        Ok(())
    }
}
pub struct Sampler;
impl Sampler {
    pub fn new(p: SamplerParams, n_vocab: usize) -> Result<Sampler> {
        Ok(Sampler)
    }
    pub fn sample(&mut self, logits: &[f32]) -> u32 {
        0
    }
    pub fn accept(&mut self, id: u32) {}
}
pub struct StopMatcher;
impl StopMatcher {
    pub fn new(s: Vec<String>) -> Self {
        StopMatcher
    }
    pub fn push(&mut self, s: &str) -> (String, bool) {
        (s.to_string(), false)
    }
    pub fn finish(&mut self) -> String {
        String::new()
    }
}
