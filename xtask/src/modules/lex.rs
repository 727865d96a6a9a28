//! Just enough of Rust's lexical structure to read module declarations, attributes, `use`
//! trees and paths: tokens in delimited groups, comments and literals left out, and the
//! removal of what `#[cfg(test)]` gates.

// ---------------------------------------------------------------------------------------------
// Lexing

/// A token; only what paths and module declarations need is kept.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) enum Tok {
    /// An identifier or keyword, raw identifiers without their `r#`.
    Ident(String),
    /// `::`
    PathSep,
    /// Any other punctuation character.
    Punct(char),
    /// A literal; a string literal keeps its text as written (for `#[path = "..."]`).
    Lit(Option<String>),
    /// A lifetime or a loop label.
    Lifetime,
}

/// A token, or a delimited group of them.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) enum Tree {
    Tok(Tok),
    /// `(`, `[` or `{` and what they enclose.
    Group(char, Vec<Tree>),
}

/// The token trees of a source file, without comments; `Err` on an unterminated literal or
/// comment or unbalanced delimiters.
pub(super) fn lex(src: &str) -> Result<Vec<Tree>, String> {
    let s: Vec<char> = src.chars().collect();
    let mut stack: Vec<(char, Vec<Tree>)> = vec![(' ', Vec::new())];
    let mut i = 0;
    while i < s.len() {
        let c = s[i];
        let next = s.get(i + 1).copied();
        let mut token = None;
        match c {
            _ if c.is_whitespace() => i += 1,
            '/' if next == Some('/') => {
                while i < s.len() && s[i] != '\n' {
                    i += 1;
                }
            }
            '/' if next == Some('*') => i = block_comment_end(&s, i)?,
            '"' => {
                let (end, text) = string_end(&s, i + 1)?;
                token = Some(Tok::Lit(Some(text)));
                i = end;
            }
            '\'' => {
                let (end, tok) = quote_end(&s, i)?;
                token = Some(tok);
                i = end;
            }
            '(' | '[' | '{' => {
                stack.push((c, Vec::new()));
                i += 1;
            }
            ')' | ']' | '}' => {
                let open = match c {
                    ')' => '(',
                    ']' => '[',
                    _ => '{',
                };
                let (delimiter, inner) = stack
                    .pop()
                    .filter(|(delimiter, _)| *delimiter == open)
                    .ok_or_else(|| format!("unbalanced `{c}` at character {i}"))?;
                stack
                    .last_mut()
                    .ok_or_else(|| format!("unbalanced `{c}` at character {i}"))?
                    .1
                    .push(Tree::Group(delimiter, inner));
                i += 1;
            }
            ':' if next == Some(':') => {
                token = Some(Tok::PathSep);
                i += 2;
            }
            _ if c.is_ascii_digit() => {
                while i < s.len()
                    && (s[i].is_alphanumeric()
                        || s[i] == '_'
                        || (s[i] == '.' && s.get(i + 1).is_some_and(char::is_ascii_digit)))
                {
                    i += 1;
                }
                token = Some(Tok::Lit(None));
            }
            _ if is_ident_start(c) => {
                let (end, tok) = word_end(&s, i)?;
                token = Some(tok);
                i = end;
            }
            _ => {
                token = Some(Tok::Punct(c));
                i += 1;
            }
        }
        if let Some(token) = token {
            stack
                .last_mut()
                .expect("the bottom of the stack is never popped")
                .1
                .push(Tree::Tok(token));
        }
    }
    match stack.pop() {
        Some((' ', trees)) if stack.is_empty() => Ok(trees),
        Some((open, _)) => Err(format!("unclosed `{open}`")),
        None => Err("unbalanced delimiters".to_owned()),
    }
}

pub(super) fn is_ident_start(c: char) -> bool {
    c.is_alphabetic() || c == '_'
}

pub(super) fn is_ident_continue(c: char) -> bool {
    c.is_alphanumeric() || c == '_'
}

/// Past the `*/` that closes the (nestable) block comment opening at `start`.
pub(super) fn block_comment_end(s: &[char], start: usize) -> Result<usize, String> {
    let mut depth = 0;
    let mut i = start;
    while i + 1 < s.len() {
        match (s[i], s[i + 1]) {
            ('/', '*') => {
                depth += 1;
                i += 2;
            }
            ('*', '/') => {
                depth -= 1;
                i += 2;
                if depth == 0 {
                    return Ok(i);
                }
            }
            _ => i += 1,
        }
    }
    Err(format!("unterminated block comment at character {start}"))
}

/// Past the `"` closing a string whose text starts at `start`, and that text.
pub(super) fn string_end(s: &[char], start: usize) -> Result<(usize, String), String> {
    let mut i = start;
    while i < s.len() {
        match s[i] {
            '\\' => i += 2,
            '"' => return Ok((i + 1, s[start..i].iter().collect())),
            _ => i += 1,
        }
    }
    Err(format!("unterminated string at character {start}"))
}

/// Past the raw string whose hashes (zero or more) start at `start`, and its text.
pub(super) fn raw_string_end(s: &[char], start: usize) -> Result<(usize, String), String> {
    let hashes = s[start..].iter().take_while(|c| **c == '#').count();
    let open = start + hashes;
    if s.get(open) != Some(&'"') {
        return Err(format!("malformed raw string at character {start}"));
    }
    let mut i = open + 1;
    while i < s.len() {
        if s[i] == '"'
            && s[i + 1..]
                .iter()
                .take(hashes)
                .filter(|c| **c == '#')
                .count()
                == hashes
        {
            return Ok((i + 1 + hashes, s[open + 1..i].iter().collect()));
        }
        i += 1;
    }
    Err(format!("unterminated raw string at character {start}"))
}

/// Past the character literal or lifetime starting with the `'` at `start`.
pub(super) fn quote_end(s: &[char], start: usize) -> Result<(usize, Tok), String> {
    if s.get(start + 1) == Some(&'\\') {
        let mut i = start + 3;
        while i < s.len() && s[i] != '\'' {
            i += 1;
        }
        return if i < s.len() {
            Ok((i + 1, Tok::Lit(None)))
        } else {
            Err(format!("unterminated character at character {start}"))
        };
    }
    if s.get(start + 2) == Some(&'\'') {
        return Ok((start + 3, Tok::Lit(None)));
    }
    let mut i = start + 1;
    while i < s.len() && is_ident_continue(s[i]) {
        i += 1;
    }
    Ok((i, Tok::Lifetime))
}

/// Past the identifier starting at `start`, or the literal it prefixes (`r"..."`, `b'x'`,
/// `br#"..."#`, `c"..."`), or the raw identifier (`r#type`).
pub(super) fn word_end(s: &[char], start: usize) -> Result<(usize, Tok), String> {
    let mut i = start;
    while i < s.len() && is_ident_continue(s[i]) {
        i += 1;
    }
    let word: String = s[start..i].iter().collect();
    let next = s.get(i).copied();
    let raw_string_follows = next == Some('"')
        || (next == Some('#')
            && s[i..]
                .iter()
                .find(|c| **c != '#')
                .is_some_and(|c| *c == '"'));
    match word.as_str() {
        "r" if next == Some('#') && s.get(i + 1).copied().is_some_and(is_ident_start) => {
            let ident_start = i + 1;
            let mut end = ident_start;
            while end < s.len() && is_ident_continue(s[end]) {
                end += 1;
            }
            Ok((end, Tok::Ident(s[ident_start..end].iter().collect())))
        }
        "r" | "br" | "cr" if raw_string_follows => {
            let (end, text) = raw_string_end(s, i)?;
            Ok((end, Tok::Lit(Some(text))))
        }
        "b" | "c" if next == Some('"') => {
            let (end, text) = string_end(s, i + 1)?;
            Ok((end, Tok::Lit(Some(text))))
        }
        "b" if next == Some('\'') => quote_end(s, i),
        _ => Ok((i, Tok::Ident(word))),
    }
}

// ---------------------------------------------------------------------------------------------
// Token-tree helpers

pub(super) fn ident_at(trees: &[Tree], i: usize) -> Option<&str> {
    match trees.get(i) {
        Some(Tree::Tok(Tok::Ident(ident))) => Some(ident),
        _ => None,
    }
}

pub(super) fn punct_at(trees: &[Tree], i: usize, c: char) -> bool {
    trees.get(i) == Some(&Tree::Tok(Tok::Punct(c)))
}

pub(super) fn path_sep_at(trees: &[Tree], i: usize) -> bool {
    trees.get(i) == Some(&Tree::Tok(Tok::PathSep))
}

pub(super) fn group_at(trees: &[Tree], i: usize, delimiter: char) -> Option<&[Tree]> {
    match trees.get(i) {
        Some(Tree::Group(d, inner)) if *d == delimiter => Some(inner),
        _ => None,
    }
}

/// The attribute starting at `i`: its length in trees, whether it is inner (`#![...]`), and
/// what its brackets enclose.
pub(super) fn attribute_at(trees: &[Tree], i: usize) -> Option<(usize, bool, &[Tree])> {
    if !punct_at(trees, i, '#') {
        return None;
    }
    if let Some(inner) = group_at(trees, i + 1, '[') {
        return Some((2, false, inner));
    }
    if punct_at(trees, i + 1, '!') {
        return group_at(trees, i + 2, '[').map(|inner| (3, true, inner));
    }
    None
}

/// Whether the attribute is a `cfg` that is false whenever `test` is: `cfg(test)`,
/// `cfg(all(test, unix))`, but not `cfg(any(test, feature = "x"))` nor `cfg(not(test))`.
pub(super) fn is_test_only(attribute: &[Tree]) -> bool {
    match (ident_at(attribute, 0), group_at(attribute, 1, '(')) {
        (Some("cfg"), Some(predicate)) if attribute.len() == 2 => {
            cfg_without_test(predicate) == Some(false)
        }
        _ => false,
    }
}

/// The value of a `cfg` predicate when `test` is off, `None` when it depends on something
/// else.
pub(super) fn cfg_without_test(predicate: &[Tree]) -> Option<bool> {
    let arguments = |inner: &[Tree]| -> Vec<Option<bool>> {
        inner
            .split(|tree| *tree == Tree::Tok(Tok::Punct(',')))
            .filter(|argument| !argument.is_empty())
            .map(cfg_without_test)
            .collect()
    };
    match (ident_at(predicate, 0), group_at(predicate, 1, '(')) {
        (Some("test"), None) if predicate.len() == 1 => Some(false),
        (Some("not"), Some(inner)) => cfg_without_test(inner).map(|value| !value),
        (Some("all"), Some(inner)) => {
            let values = arguments(inner);
            if values.contains(&Some(false)) {
                Some(false)
            } else if values.iter().all(|value| *value == Some(true)) {
                Some(true)
            } else {
                None
            }
        }
        (Some("any"), Some(inner)) => {
            let values = arguments(inner);
            if values.contains(&Some(true)) {
                Some(true)
            } else if values.iter().all(|value| *value == Some(false)) {
                Some(false)
            } else {
                None
            }
        }
        _ => None,
    }
}

/// The file a `#[path = "..."]` attribute names.
pub(super) fn path_attribute(attribute: &[Tree]) -> Option<&str> {
    match attribute {
        [
            Tree::Tok(Tok::Ident(path)),
            Tree::Tok(Tok::Punct('=')),
            Tree::Tok(Tok::Lit(Some(file))),
        ] if path == "path" => Some(file),
        _ => None,
    }
}

/// `trees` without what `#[cfg(test)]` gates, at every depth; `None` when an inner
/// `#![cfg(test)]` gates all of it.
pub(super) fn strip_tests(trees: &[Tree]) -> Option<Vec<Tree>> {
    let mut kept = Vec::with_capacity(trees.len());
    let mut i = 0;
    while i < trees.len() {
        if let Some((len, inner, attribute)) = attribute_at(trees, i) {
            if !is_test_only(attribute) {
                kept.extend_from_slice(&trees[i..i + len]);
                i += len;
            } else if inner {
                return None;
            } else {
                let mut start = i + len;
                while let Some((len, false, _)) = attribute_at(trees, start) {
                    start += len;
                }
                i = gated_end(trees, start);
            }
            continue;
        }
        kept.push(match &trees[i] {
            Tree::Group(delimiter, inner) => {
                Tree::Group(*delimiter, strip_tests(inner).unwrap_or_default())
            }
            tree => tree.clone(),
        });
        i += 1;
    }
    Some(kept)
}

/// Where the item, statement, field or match arm an attribute gates, starting at `start`,
/// ends.
pub(super) fn gated_end(trees: &[Tree], start: usize) -> usize {
    let mut i = start;
    if ident_at(trees, i) == Some("pub") {
        i += 1;
        if group_at(trees, i, '(').is_some() {
            i += 1;
        }
    }
    let keyword = ident_at(trees, i);
    let qualifies_fn = matches!(
        ident_at(trees, i + 1),
        Some("fn" | "unsafe" | "async" | "extern")
    );
    let up_to_semicolon = match keyword {
        Some("use" | "static" | "type") => true,
        Some("const") => !qualifies_fn,
        Some("extern") => ident_at(trees, i + 1) == Some("crate"),
        _ => false,
    };
    let item_with_body = matches!(
        keyword,
        Some(
            "fn" | "struct"
                | "enum"
                | "union"
                | "trait"
                | "impl"
                | "mod"
                | "extern"
                | "macro_rules"
                | "unsafe"
                | "async"
                | "const"
                | "auto"
        )
    );
    for j in i..trees.len() {
        let is_body = group_at(trees, j, '{').is_some();
        if punct_at(trees, j, ';') {
            return j + 1;
        }
        if up_to_semicolon {
            continue;
        }
        if item_with_body {
            if is_body {
                return j + 1;
            }
            continue;
        }
        // A statement, field or match arm: up to `;` or `,`, or a block that ends it.
        if punct_at(trees, j, ',') {
            return j + 1;
        }
        let arm_body = j >= 2 && punct_at(trees, j - 1, '>') && punct_at(trees, j - 2, '=');
        if is_body && (j == i || punct_at(trees, j - 1, '!') || arm_body) {
            return j + 1 + usize::from(punct_at(trees, j + 1, ','));
        }
    }
    trees.len()
}
