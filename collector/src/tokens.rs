//! Agent tokens: one `AGENT-NAME TOKEN [KEY=VALUE …]` per line of `--tokens FILE` (`#`
//! comments). An upload's bearer token names the agent that sent it; the `KEY=VALUE` pins are
//! labels every window of that agent must carry (`host=relay-3`: that token cannot write as
//! another host).
use std::collections::{BTreeMap, HashMap};

#[derive(Clone, Debug, Default)]
pub struct Tokens {
    by_token: HashMap<String, Agent>,
}

/// The agent a token names.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Agent {
    pub name: String,
    /// Labels its windows must carry, with these values.
    pub pins: BTreeMap<String, String>,
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
            let (Some(name), Some(token)) = (parts.next(), parts.next()) else {
                return Err(format!(
                    "{file}:{}: expected `AGENT-NAME TOKEN [KEY=VALUE …]`",
                    i + 1
                ));
            };
            if token.len() < 16 {
                return Err(format!(
                    "{file}:{}: the token of `{name}` is shorter than 16 characters",
                    i + 1
                ));
            }
            let mut pins = BTreeMap::new();
            for pin in parts {
                match pin.split_once('=') {
                    Some((k, v)) if !k.is_empty() && !v.is_empty() => {
                        pins.insert(k.to_string(), v.to_string());
                    }
                    _ => {
                        return Err(format!(
                            "{file}:{}: `{pin}` is not a label pin KEY=VALUE (after `AGENT-NAME TOKEN`)",
                            i + 1
                        ))
                    }
                }
            }
            let agent = Agent {
                name: name.to_string(),
                pins,
            };
            if by_token.insert(token.to_string(), agent).is_some() {
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
    pub fn agent(&self, token: &str) -> Option<&Agent> {
        let mut found = None;
        for (t, agent) in &self.by_token {
            if phaseprof_view::web::auth::same(t, token) {
                found = Some(agent);
            }
        }
        found
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // Checks parsing, lookup, label pins and the errors a bad tokens file gets.
    #[test]
    fn tokens_file() {
        let t = Tokens::parse(
            "t",
            "# fleet\nhost-a aaaaaaaaaaaaaaaaaaaa host=a\nhost-b bbbbbbbbbbbbbbbbbbbb # note\n",
        )
        .unwrap();
        let a = t.agent("aaaaaaaaaaaaaaaaaaaa").unwrap();
        assert_eq!(a.name, "host-a");
        assert_eq!(a.pins, BTreeMap::from([("host".into(), "a".into())]));
        assert!(t.agent("bbbbbbbbbbbbbbbbbbbb").unwrap().pins.is_empty());
        assert_eq!(t.agent("nope"), None);
        assert!(Tokens::parse("t", "x short").unwrap_err().contains("t:1"));
        assert!(Tokens::parse("t", "x aaaaaaaaaaaaaaaaaaaa y")
            .unwrap_err()
            .contains("label pin"));
        assert!(Tokens::parse("t", "x")
            .unwrap_err()
            .contains("AGENT-NAME TOKEN"));
        assert!(Tokens::parse("t", "")
            .unwrap_err()
            .contains("no agent tokens"));
    }
}
