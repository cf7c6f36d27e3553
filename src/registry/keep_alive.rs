//! How long a model stays loaded after its last request, spelt as Ollama spells it: a
//! duration string ("15m", "30s", "1h"), a number of seconds, a negative value (stay
//! loaded) or 0 (unload as soon as the answer is done).
use std::time::Duration;

use serde::{Deserialize, Deserializer};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KeepAlive {
    For(Duration),
    Forever,
}

impl KeepAlive {
    pub const DEFAULT: KeepAlive = KeepAlive::For(Duration::from_secs(15 * 60));

    pub fn parse(text: &str) -> Result<KeepAlive, String> {
        let t = text.trim();
        if let Ok(n) = t.parse::<f64>() {
            return Self::from_seconds(n);
        }
        if t.starts_with('-') {
            return Ok(KeepAlive::Forever);
        }
        humantime::parse_duration(t)
            .map(KeepAlive::For)
            .map_err(|e| format!("keep_alive '{text}' is not a duration like \"5m\", \"30s\" or -1: {e}"))
    }

    pub fn from_seconds(n: f64) -> Result<KeepAlive, String> {
        if n.is_nan() {
            return Err("keep_alive must be a number of seconds or a duration like \"5m\"".into());
        }
        Ok(if n < 0.0 { KeepAlive::Forever } else { KeepAlive::For(Duration::from_secs_f64(n.min(1e9))) })
    }

    /// 0: unload right after the answer.
    pub fn is_zero(self) -> bool {
        self == KeepAlive::For(Duration::ZERO)
    }
}

impl<'de> Deserialize<'de> for KeepAlive {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        #[derive(Deserialize)]
        #[serde(untagged)]
        enum Raw {
            Number(f64),
            Text(String),
        }
        match Raw::deserialize(d)? {
            Raw::Number(n) => KeepAlive::from_seconds(n),
            Raw::Text(t) => KeepAlive::parse(&t),
        }
        .map_err(serde::de::Error::custom)
    }
}

impl serde::Serialize for KeepAlive {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match self {
            KeepAlive::Forever => s.serialize_i64(-1),
            KeepAlive::For(d) => s.serialize_f64(d.as_secs_f64()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_ollamas_spellings() {
        assert_eq!(KeepAlive::parse("5m").unwrap(), KeepAlive::For(Duration::from_secs(300)));
        assert_eq!(KeepAlive::parse("1h30m").unwrap(), KeepAlive::For(Duration::from_secs(5400)));
        assert_eq!(KeepAlive::parse("-1").unwrap(), KeepAlive::Forever);
        assert_eq!(KeepAlive::parse("-1m").unwrap(), KeepAlive::Forever);
        assert!(KeepAlive::parse("0").unwrap().is_zero());
        let n: KeepAlive = serde_json::from_str("-1").unwrap();
        assert_eq!(n, KeepAlive::Forever);
        let n: KeepAlive = serde_json::from_str("2.5").unwrap();
        assert_eq!(n, KeepAlive::For(Duration::from_millis(2500)));
        assert!(serde_json::from_str::<KeepAlive>("\"soon\"").unwrap_err().to_string().contains("keep_alive 'soon'"));
    }
}
