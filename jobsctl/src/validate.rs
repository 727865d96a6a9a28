//! `jobsctl envelope validate`: check envelopes the way every consumer will.

use std::io::{BufRead, Read, Write};

use anyhow::{Context, Result};
use jobs_core::Envelope;

/// Validates one envelope (or one per line with `lines`) from `input`, printing each problem
/// with the field it names. Returns whether every envelope was valid.
pub(crate) fn run(
    input: impl Read,
    lines: bool,
    as_json: bool,
    out: &mut impl Write,
) -> Result<bool> {
    let mut all_valid = true;
    if lines {
        let reader = std::io::BufReader::new(input);
        for (n, line) in reader.split(b'\n').enumerate() {
            let line = line.context("reading the input")?;
            let line = line.strip_suffix(b"\r").unwrap_or(&line);
            if line.iter().all(u8::is_ascii_whitespace) {
                continue;
            }
            all_valid &= report(line, Some(n + 1), as_json, out)?;
        }
    } else {
        let mut bytes = Vec::new();
        std::io::BufReader::new(input)
            .read_to_end(&mut bytes)
            .context("reading the input")?;
        let trimmed = bytes.trim_ascii_end();
        all_valid = report(trimmed, None, as_json, out)?;
    }
    Ok(all_valid)
}

fn report(bytes: &[u8], line: Option<usize>, as_json: bool, out: &mut impl Write) -> Result<bool> {
    let decoded = Envelope::decode(bytes);
    if as_json {
        let value = match &decoded {
            Ok(envelope) => serde_json::json!({
                "line": line,
                "valid": true,
                "job_id": envelope.job_id.to_string(),
                "kind": envelope.kind.as_str(),
            }),
            Err(e) => serde_json::json!({
                "line": line,
                "valid": false,
                "issues": e.issues().iter().map(|issue| serde_json::json!({
                    "field": issue.field.to_string(),
                    "problem": issue.problem.to_string(),
                })).collect::<Vec<_>>(),
            }),
        };
        writeln!(out, "{value}")?;
        return Ok(decoded.is_ok());
    }
    let prefix = line.map(|n| format!("line {n}: ")).unwrap_or_default();
    match decoded {
        Ok(envelope) => {
            writeln!(
                out,
                "{prefix}valid: job {} kind {}",
                envelope.job_id, envelope.kind
            )?;
            Ok(true)
        }
        Err(e) => {
            for issue in e.issues() {
                writeln!(out, "{prefix}invalid: {}: {}", issue.field, issue.problem)?;
            }
            Ok(false)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::run;

    const VALID: &str = r#"{"job_id":"017f22e2-79b0-7cc3-98c4-dc0c0c07398f","tenant_id":"0b6c5e5a-3c1f-4d8e-9a57-2f1e4c6b7d90","correlation_id":"0192f0a4-8d7e-7c3b-a1f2-6e5d4c3b2a19","kind":"billing.invoice_issued","data":null}"#;

    #[test]
    fn json_lines_report_each_invalid_line_with_its_fields() {
        let v4 = VALID.replace("7cc3", "4cc3");
        let input = format!("{VALID}\n\n{v4}\n{{\"kind\":\"x\"}}\n");
        let mut out = Vec::new();
        let valid = run(input.as_bytes(), true, false, &mut out).expect("reads");
        let out = String::from_utf8(out).expect("utf-8");
        assert!(!valid);
        assert!(out.contains("line 1: valid"), "{out}");
        assert!(
            out.contains("line 3: invalid: job_id: must be a UUID version 7, found version 4"),
            "{out}"
        );
        assert!(
            out.contains("line 4: invalid: tenant_id: is missing"),
            "{out}"
        );
    }

    #[test]
    fn a_single_envelope_with_a_trailing_newline_is_valid() {
        let mut out = Vec::new();
        assert!(run(format!("{VALID}\n").as_bytes(), false, false, &mut out).expect("reads"));
    }
}
