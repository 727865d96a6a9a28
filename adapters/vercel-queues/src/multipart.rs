//! `multipart/mixed`, as Vercel uses it for receive answers and batch sends (RFC 2046 §5.1).

use std::collections::HashMap;

/// One part: its headers (names lowercased) and its body, byte for byte.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Part {
    pub(crate) headers: HashMap<String, String>,
    pub(crate) body: Vec<u8>,
}

impl Part {
    pub(crate) fn header(&self, name: &str) -> Option<&str> {
        self.headers.get(name).map(String::as_str)
    }
}

/// The `boundary` parameter of a `multipart/mixed` content type.
pub(crate) fn boundary(content_type: &str) -> Option<&str> {
    let (media, params) = content_type.split_once(';')?;
    if !media.trim().eq_ignore_ascii_case("multipart/mixed") {
        return None;
    }
    params.split(';').find_map(|param| {
        let (name, value) = param.split_once('=')?;
        name.trim()
            .eq_ignore_ascii_case("boundary")
            .then(|| value.trim().trim_matches('"'))
            .filter(|b| !b.is_empty())
    })
}

/// Splits `body` into its parts, or says what is malformed.
pub(crate) fn parse(body: &[u8], boundary: &str) -> Result<Vec<Part>, String> {
    let delimiter = format!("--{boundary}").into_bytes();
    let mut rest = match find(body, &delimiter) {
        Some(at) => &body[at + delimiter.len()..],
        None => return Err("no boundary delimiter found".into()),
    };
    let next_delimiter = [b"\r\n".as_slice(), &delimiter].concat();
    let mut parts = Vec::new();
    loop {
        if rest.starts_with(b"--") {
            return Ok(parts);
        }
        rest = strip_line_end(skip_transport_padding(rest))
            .ok_or("a delimiter line does not end with CRLF")?;
        let end = find(rest, &next_delimiter).ok_or("a part is not closed by a delimiter")?;
        parts.push(part(&rest[..end])?);
        rest = &rest[end + next_delimiter.len()..];
    }
}

fn part(raw: &[u8]) -> Result<Part, String> {
    let (head, body) = match find(raw, b"\r\n\r\n") {
        Some(at) => (&raw[..at], &raw[at + 4..]),
        // A part with no headers starts with the blank line itself.
        None if raw.starts_with(b"\r\n") => (&raw[..0], &raw[2..]),
        None => return Err("a part has no blank line after its headers".into()),
    };
    let head = std::str::from_utf8(head).map_err(|_| "part headers are not UTF-8")?;
    let mut headers = HashMap::new();
    for line in head.split("\r\n").filter(|l| !l.is_empty()) {
        let (name, value) = line
            .split_once(':')
            .ok_or_else(|| format!("malformed part header line {line:?}"))?;
        headers.insert(name.trim().to_ascii_lowercase(), value.trim().to_owned());
    }
    Ok(Part {
        headers,
        body: body.to_vec(),
    })
}

fn skip_transport_padding(s: &[u8]) -> &[u8] {
    let spaces = s.iter().take_while(|b| matches!(b, b' ' | b'\t')).count();
    &s[spaces..]
}

fn strip_line_end(s: &[u8]) -> Option<&[u8]> {
    s.strip_prefix(b"\r\n")
}

fn find(haystack: &[u8], needle: &[u8]) -> Option<usize> {
    haystack.windows(needle.len()).position(|w| w == needle)
}

/// A part to write: its headers (name, value) and its body.
pub(crate) type OutPart<'a> = (Vec<(&'a str, String)>, &'a [u8]);

/// Writes `parts` as a `multipart/mixed` body delimited by `boundary`.
pub(crate) fn write(boundary: &str, parts: &[OutPart<'_>]) -> Vec<u8> {
    let mut out = Vec::new();
    for (headers, body) in parts {
        out.extend_from_slice(format!("--{boundary}\r\n").as_bytes());
        for (name, value) in headers {
            out.extend_from_slice(format!("{name}: {value}\r\n").as_bytes());
        }
        out.extend_from_slice(b"\r\n");
        out.extend_from_slice(body);
        out.extend_from_slice(b"\r\n");
    }
    out.extend_from_slice(format!("--{boundary}--\r\n").as_bytes());
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_what_the_emulator_sends() {
        let body =
            b"--vqs-test-boundary\r\nContent-Type: application/json\r\nVqs-Message-Id: msg_1\r\n\
Vqs-Receipt-Handle: rh_1:msg_1:g1 /needs encoding\r\nVqs-Delivery-Count: 1\r\n\r\n{\"a\":1}\r\n\
--vqs-test-boundary\r\nVqs-Message-Id: msg_2\r\n\r\n\r\n--x\r\n\r\n--vqs-test-boundary--\r\n";
        let parts = parse(body, "vqs-test-boundary").unwrap();
        assert_eq!(parts.len(), 2);
        assert_eq!(
            parts[0].header("vqs-receipt-handle"),
            Some("rh_1:msg_1:g1 /needs encoding")
        );
        assert_eq!(parts[0].body, b"{\"a\":1}");
        // A body may hold CRLFs and dashes that are not the delimiter.
        assert_eq!(parts[1].body, b"\r\n--x\r\n");
    }

    #[test]
    fn written_parts_parse_back_byte_for_byte() {
        let bodies: [&[u8]; 3] = [b"", b"\x00\xff binary\r\n", b"{\"k\":\"--b\"}"];
        let parts: Vec<_> = bodies
            .iter()
            .map(|b| (vec![("Content-Type", "application/json".to_owned())], *b))
            .collect();
        let written = write("b", &parts);
        let parsed = parse(&written, "b").unwrap();
        assert_eq!(parsed.len(), 3);
        for (parsed, body) in parsed.iter().zip(bodies) {
            assert_eq!(parsed.body, body);
            assert_eq!(parsed.header("content-type"), Some("application/json"));
        }
    }

    #[test]
    fn boundaries_and_malformed_bodies() {
        assert_eq!(boundary("multipart/mixed; boundary=abc"), Some("abc"));
        assert_eq!(
            boundary("Multipart/Mixed;charset=x; boundary=\"q r\""),
            Some("q r")
        );
        assert_eq!(boundary("application/json"), None);
        assert!(parse(b"garbage", "b").is_err());
        assert!(parse(b"--b\r\nX: y\r\n\r\nunterminated", "b").is_err());
        assert_eq!(parse(b"--b--\r\n", "b").unwrap(), vec![]);
    }
}
