//! Agent tokens: one `AGENT-NAME TOKEN` per line of `--tokens FILE` (`#` comments). An upload's
//! bearer token names the agent that sent it.
use std::collections::HashMap;

#[derive(Clone, Debug, Default)]
pub struct Tokens {
    by_token: HashMap<String, String>,
}

impl Tokens {
    /// Parses the file's text; errors name the line.
    pub fn parse(file: &str, text: &str) -> Result<Self, String> {
        let mut by_token = HashMap::new();
        for (i, line) in text.lines().enumerate() {
            let line = line.split('#').next().unwrap_or("").trim();
            if line.is_empty() {
                continue;
            }
            let mut parts = line.split_whitespace();
            let (Some(agent), Some(token), None) = (parts.next(), parts.next(), parts.next())
            else {
                return Err(format!("{file}:{}: expected `AGENT-NAME TOKEN`", i + 1));
            };
            if token.len() < 16 {
                return Err(format!(
                    "{file}:{}: the token of `{agent}` is shorter than 16 characters",
                    i + 1
                ));
            }
            if by_token
                .insert(token.to_string(), agent.to_string())
                .is_some()
            {
                return Err(format!("{file}:{}: this token is given twice", i + 1));
            }
        }
        if by_token.is_empty() {
            return Err(format!(
                "{file}: no agent tokens (lines of `AGENT-NAME TOKEN`)"
            ));
        }
        Ok(Tokens { by_token })
    }

    /// The agent a token belongs to (compared in constant time against every token).
    pub fn agent(&self, token: &str) -> Option<&str> {
        let mut found = None;
        for (t, agent) in &self.by_token {
            let same = t.len() == token.len()
                && t.bytes()
                    .zip(token.bytes())
                    .fold(0u8, |acc, (a, b)| acc | (a ^ b))
                    == 0;
            if same {
                found = Some(agent.as_str());
            }
        }
        found
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // Checks parsing, lookup and the errors a bad tokens file gets.
    #[test]
    fn tokens_file() {
        let t = Tokens::parse(
            "t",
            "# fleet\nhost-a aaaaaaaaaaaaaaaaaaaa\nhost-b bbbbbbbbbbbbbbbbbbbb # note\n",
        )
        .unwrap();
        assert_eq!(t.agent("aaaaaaaaaaaaaaaaaaaa"), Some("host-a"));
        assert_eq!(t.agent("nope"), None);
        assert!(Tokens::parse("t", "x short").unwrap_err().contains("t:1"));
        assert!(Tokens::parse("t", "x aaaaaaaaaaaaaaaaaaaa y")
            .unwrap_err()
            .contains("AGENT-NAME TOKEN"));
        assert!(Tokens::parse("t", "")
            .unwrap_err()
            .contains("no agent tokens"));
    }
}
