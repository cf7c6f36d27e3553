//! Reasoning handed to a client that keeps no server state (`store: false` with
//! `include: ["reasoning.encrypted_content"]`, as Codex sends every turn): the reasoning
//! item carries its text as an opaque `encrypted_content`, and the client sends that back
//! with the item on its next turn. mlxbar keeps nothing between requests, so the token is the
//! text itself, base64 behind a version tag: opaque to the client, readable only by mlxbar.
//! It is not encrypted: the reasoning is the local user's own model's, and the same text is
//! in the item's `content` anyway. Another server's tokens are refused by the input reader.
use base64::engine::general_purpose::STANDARD;
use base64::Engine;

const TAG: &str = "mlxbar:v1:";

/// The `encrypted_content` of reasoning `text`.
pub fn seal(text: &str) -> String {
    format!("{TAG}{}", STANDARD.encode(text))
}

/// The text of a token [`seal`] made; None for anything else (another server's, or damaged).
pub fn open(token: &str) -> Option<String> {
    let bytes = STANDARD.decode(token.strip_prefix(TAG)?).ok()?;
    String::from_utf8(bytes).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_sealed_text_opens_and_nothing_else_does() {
        let text = "The user wants the weather: call get_weather. ✓";
        let token = seal(text);
        assert!(!token.contains("weather"), "opaque: {token}");
        assert_eq!(open(&token).as_deref(), Some(text));
        assert_eq!(open("gAAAAABo-another-servers-token"), None);
        assert_eq!(open("mlxbar:v1:!!!"), None);
        assert_eq!(open(&seal("")).as_deref(), Some(""));
    }
}
