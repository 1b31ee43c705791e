//! fastjson's default leniency (`JSON.DEFAULT_PARSER_FEATURE`: `AllowUnQuotedFieldNames`, `AllowSingleQuotes`,
//! `AllowArbitraryCommas`; and comments, which its lexer skips), made strict JSON, so that a hand-written Java document that Java loads loads here
//! too. A document is read strictly first; only one that fails is read again through [`strict_json`].

/// `text` with unquoted field names quoted, single-quoted strings double-quoted, comments dropped and commas
/// that stand next to a bracket or another comma dropped; `None` when there is nothing to change. Lines stay where they are (no
/// line break is added or removed), so an error in the result names the line of the text.
pub(crate) fn strict_json(text: &str) -> Option<String> {
    let chars: Vec<char> = text.chars().collect();
    let mut out = String::with_capacity(text.len() + 16);
    let mut changed = false;
    // Where the last character that is not white space was written, and which it was ('w' for a bare word,
    // '"' for a string).
    let mut last: Option<(usize, char)> = None;
    let mut i = 0;
    while i < chars.len() {
        let c = chars[i];
        match c {
            '"' => {
                let at = out.len();
                out.push('"');
                i += 1;
                while i < chars.len() {
                    let d = chars[i];
                    out.push(d);
                    i += 1;
                    if d == '\\' {
                        if let Some(&e) = chars.get(i) {
                            out.push(e);
                            i += 1;
                        }
                    } else if d == '"' {
                        break;
                    }
                }
                last = Some((at, '"'));
            }
            '\'' => {
                changed = true;
                let at = out.len();
                out.push('"');
                i += 1;
                while i < chars.len() {
                    let d = chars[i];
                    i += 1;
                    match d {
                        '\\' => match chars.get(i) {
                            Some('\'') => {
                                out.push('\'');
                                i += 1;
                            }
                            Some(&e) => {
                                out.push('\\');
                                out.push(e);
                                i += 1;
                            }
                            None => out.push('\\'),
                        },
                        '"' => out.push_str("\\\""),
                        '\'' => break,
                        _ => out.push(d),
                    }
                }
                out.push('"');
                last = Some((at, '"'));
            }
            ',' => {
                i += 1;
                // After an opening bracket or another comma: one too many.
                if matches!(last, None | Some((_, '[' | '{' | ','))) {
                    changed = true;
                } else {
                    last = Some((out.len(), ','));
                    out.push(',');
                }
            }
            ']' | '}' => {
                // Before a closing bracket: one too many.
                if let Some((at, ',')) = last {
                    out.remove(at);
                    changed = true;
                }
                last = Some((out.len(), c));
                out.push(c);
                i += 1;
            }
            // Comments (fastjson's lexer skips them with white space): dropped, their line breaks kept.
            '/' if matches!(chars.get(i + 1), Some('/' | '*')) => {
                changed = true;
                let block = chars[i + 1] == '*';
                i += 2;
                while i < chars.len() {
                    if block && chars[i] == '*' && chars.get(i + 1) == Some(&'/') {
                        i += 2;
                        break;
                    }
                    if chars[i] == '\n' {
                        out.push('\n');
                        if !block {
                            i += 1;
                            break;
                        }
                    }
                    i += 1;
                }
            }
            c if c.is_whitespace() => {
                out.push(c);
                i += 1;
            }
            c if c.is_alphabetic() || c == '_' || c == '$' => {
                let start = i;
                while i < chars.len() && (chars[i].is_alphanumeric() || chars[i] == '_' || chars[i] == '$') {
                    i += 1;
                }
                let next = chars[i..].iter().find(|c| !c.is_whitespace());
                let at = out.len();
                // A field name when a colon follows (`true`, `false` and `null` are values: none does).
                if next == Some(&':') {
                    out.push('"');
                    out.extend(&chars[start..i]);
                    out.push('"');
                    changed = true;
                } else {
                    out.extend(&chars[start..i]);
                }
                last = Some((at, 'w'));
            }
            _ => {
                last = Some((out.len(), c));
                out.push(c);
                i += 1;
            }
        }
    }
    changed.then_some(out)
}

#[cfg(test)]
mod tests {
    use super::strict_json;

    #[test]
    fn fastjson_leniency_becomes_strict_json_and_strict_json_is_left_alone() {
        assert_eq!(strict_json(r#"[{"a": 1, "b": [1, 2]}]"#), None);
        assert_eq!(strict_json("[{a: 'x', \"b\": true,},,]").as_deref(), Some(r#"[{"a": "x", "b": true}]"#));
        assert_eq!(strict_json(r#"{'it\'s': 'say "hi"'}"#).as_deref(), Some(r#"{"it's": "say \"hi\""}"#));
        assert_eq!(strict_json("[,1,,2,]").as_deref(), Some("[1,2]"));
        assert_eq!(strict_json("{a:\n 'b',\n}").as_deref(), Some("{\"a\":\n \"b\"\n}"), "lines stay");
        assert_eq!(
            strict_json("[ // rules\n{a: 1 /* one\n two */}]").as_deref(),
            Some("[ \n{\"a\": 1 \n}]"),
            "comments dropped, lines kept"
        );
        assert_eq!(strict_json(r#"{"a": "http://x/*y*/"}"#), None, "inside a string, text");
        // Commas and quotes inside strings are text.
        assert_eq!(strict_json(r#"{a: "x,]'y"}"#).as_deref(), Some(r#"{"a": "x,]'y"}"#));
        // Cut-off input does not panic.
        for cut in ["'", "\"", "'\\", "\"\\", "{a", "[,", "/", "/*", "//", "/* *"] {
            let _ = strict_json(cut);
        }
    }
}
