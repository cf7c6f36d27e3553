//! Renders a model's Jinja chat template (HF semantics) with minijinja, plus the
//! Python-method compatibility HF templates rely on (`.strip()`, `.startswith()`, ...).
use anyhow::{anyhow, Context, Result};
use minijinja::{context, Environment, Error, ErrorKind};
use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct ChatMessage {
    pub role: String,
    pub content: String,
}

pub struct ChatTemplate {
    env: Environment<'static>,
    source: String,
    bos_token: Option<String>,
    eos_token: Option<String>,
}

impl ChatTemplate {
    pub fn new(source: String, bos_token: Option<String>, eos_token: Option<String>) -> Result<Self> {
        let mut env = Environment::new();
        minijinja_contrib::add_to_environment(&mut env);
        env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
        env.set_trim_blocks(true);
        env.set_lstrip_blocks(true);
        env.add_function("raise_exception", |msg: String| -> Result<String, Error> { Err(Error::new(ErrorKind::InvalidOperation, msg)) });
        env.add_function("strftime_now", |fmt: String| -> String { strftime_now(&fmt) });
        env.add_template_owned("chat", source.clone()).context("parsing the chat template")?;
        Ok(ChatTemplate { env, source, bos_token, eos_token })
    }

    /// The prompt text for `messages`, ending with the assistant's turn opener when
    /// `add_generation_prompt`.
    pub fn render(&self, messages: &[ChatMessage], add_generation_prompt: bool) -> Result<String> {
        let tpl = self.env.get_template("chat").map_err(|e| anyhow!("{e}"))?;
        tpl.render(context! {
            messages => messages,
            add_generation_prompt => add_generation_prompt,
            bos_token => self.bos_token.clone().unwrap_or_default(),
            eos_token => self.eos_token.clone().unwrap_or_default(),
        })
        .map_err(|e| anyhow!("chat template: {e}"))
    }

    /// Special tokens the template closes an assistant turn with (`<|im_end|>`,
    /// `<|eot_id|>`, `<end_of_turn>`), which end generation like EOS does.
    pub fn end_of_turn_tokens(&self) -> Vec<&'static str> {
        ["<|im_end|>", "<|eot_id|>", "<|end|>", "<end_of_turn>", "<|endoftext|>"]
            .into_iter()
            .filter(|t| self.source.contains(t) && *t != "<|endoftext|>")
            .collect()
    }
}

/// `strftime_now` as HF defines it for templates that print today's date (Llama 3.x).
fn strftime_now(fmt: &str) -> String {
    chrono::Local::now().format(fmt).to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renders_chatml_with_python_methods() {
        let src = "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content.strip() }}<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}";
        let t = ChatTemplate::new(src.into(), None, Some("<|im_end|>".into())).unwrap();
        let out = t.render(&[ChatMessage { role: "user".into(), content: "  hi  ".into() }], true).unwrap();
        assert_eq!(out, "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n");
        assert_eq!(t.end_of_turn_tokens(), vec!["<|im_end|>"]);
    }

    #[test]
    fn raise_exception_becomes_an_error() {
        let t = ChatTemplate::new("{{ raise_exception('roles must alternate') }}".into(), None, None).unwrap();
        let err = t.render(&[], true).unwrap_err().to_string();
        assert!(err.contains("roles must alternate"), "{err}");
    }

    #[test]
    fn strftime_now_formats_a_date() {
        let s = strftime_now("%d %B %Y");
        assert_eq!(s.split(' ').count(), 3);
        assert!(s.split(' ').next_back().unwrap().parse::<i32>().unwrap() >= 2024);
    }
}
