//! Reading a double-quoted value out of a line of text, as ztunnel's text
//! log and the Prometheus exposition format write them: `\"` and `\\`
//! escape the next character.

/// The value of a quoted string whose opening quote is already consumed
/// (`text` begins just after it), and what follows its closing quote. An
/// unterminated string takes the rest of `text`.
pub fn take(text: &str) -> (String, &str) {
    let mut value = String::new();
    let mut chars = text.char_indices();
    while let Some((at, c)) = chars.next() {
        match c {
            '\\' => value.extend(chars.next().map(|(_, c)| c)),
            '"' => return (value, &text[at + 1..]),
            c => value.push(c),
        }
    }
    (value, "")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn escapes_are_undone_and_the_rest_is_returned() {
        assert_eq!(
            take(r#"a \"b\" c\\d" rest"#),
            (r#"a "b" c\d"#.to_owned(), " rest")
        );
        assert_eq!(take("unterminated"), ("unterminated".to_owned(), ""));
        assert_eq!(take(r#"" x"#), (String::new(), " x"));
    }
}
