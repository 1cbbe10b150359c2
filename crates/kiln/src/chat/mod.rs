//! Placeholder until the chat module lands (interface only).
#![allow(dead_code, unused_variables)]
use crate::error::{KilnError, Result};
use crate::gguf::GgufFile;
pub struct Message;
impl Message {
    pub fn user(s: &str) -> Self {
        Message
    }
    pub fn system(s: &str) -> Self {
        Message
    }
}
pub struct ChatTemplate;
impl ChatTemplate {
    pub fn from_gguf(g: &GgufFile) -> Result<Option<Self>> {
        Ok(None)
    }
    pub fn render(
        &self,
        m: &[Message],
        add_generation_prompt: bool,
        tools: Option<&serde_json::Value>,
    ) -> Result<String> {
        Err(KilnError::Template("not yet".into()))
    }
}
