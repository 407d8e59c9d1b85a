//! Names as a terminal shows them. Thread, program and function names come from the targets
//! (a thread names itself, a user names a binary): printed raw, an escape sequence in one would
//! clear the screen, recolour it or retitle the window, and a newline would forge a table row.
//! Every control character is shown escaped instead (`\n`, `\e`, `\u{9b}` ...).
use std::borrow::Cow;

use phaseprof_model::Profile;

/// `s` with its control characters (C0, DEL, C1) escaped; borrowed when it has none.
pub fn printable(s: &str) -> Cow<'_, str> {
    if !s.chars().any(char::is_control) {
        return Cow::Borrowed(s);
    }
    let mut out = String::with_capacity(s.len() + 8);
    for c in s.chars() {
        match c {
            '\n' => out.push_str("\\n"),
            '\t' => out.push_str("\\t"),
            '\r' => out.push_str("\\r"),
            '\x1b' => out.push_str("\\e"),
            c if c.is_control() => out.push_str(&c.escape_unicode().to_string()),
            c => out.push(c),
        }
    }
    Cow::Owned(out)
}

fn clean(s: &mut String) {
    if let Cow::Owned(o) = printable(s) {
        *s = o;
    }
}

/// A copy of `p` whose every name is `printable`, for the text a terminal shows.
pub fn for_terminal(p: &Profile) -> Profile {
    let mut p = p.clone();
    let m = &mut p.meta;
    clean(&mut m.comm);
    clean(&mut m.exe);
    clean(&mut m.host);
    m.command.iter_mut().for_each(clean);
    m.threads.values_mut().for_each(clean);
    m.labels.values_mut().for_each(clean);
    m.notes.values_mut().for_each(clean);
    p.phases.iter_mut().for_each(clean);
    for f in &mut p.frames {
        clean(&mut f.function);
        clean(&mut f.module);
    }
    p
}

#[cfg(test)]
mod tests {
    use super::*;

    // Checks escapes, colours, an OSC title with BEL, CSI in its C1 form and a newline: all
    // shown, none passed through; plain names borrowed as they are.
    #[test]
    fn control_characters_are_shown_not_sent() {
        let evil = "worker\x1b[2J\x1b]0;pwned\x07\u{9b}31m\nforged row";
        let shown = printable(evil);
        assert!(!shown.chars().any(char::is_control), "{shown:?}");
        assert_eq!(
            shown,
            "worker\\e[2J\\e]0;pwned\\u{7}\\u{9b}31m\\nforged row"
        );
        assert!(matches!(printable("plain name"), Cow::Borrowed(_)));
    }
}
