//! The console's markup, built with [`maud`]: every value interpolated into a page is
//! escaped by construction (`PreEscaped` marks the few literal fragments that are markup), so
//! a payload or an error text holding markup renders as text. [`page`] then shows what would
//! hide itself (control, bidirectional and zero-width characters), whichever value brought it.

use std::fmt::Write as _;

use maud::{DOCTYPE, Markup, html};

use super::auth::Session;

/// A whole page, ready to send: the layout, the navigation for a `session` (with the sign-out
/// form when it signed in: a console without sign-in has nothing to sign out of) and `body`,
/// shown by [`shown`].
pub(crate) fn page(title: &str, session: Option<&Session>, body: Markup) -> String {
    let page = html! {
        (DOCTYPE)
        html lang="en" {
            head {
                meta charset="utf-8";
                meta name="viewport" content="width=device-width, initial-scale=1";
                title { (title) " · jobs console" }
                link rel="stylesheet" href="/assets/console.css";
                script src="/assets/console.js" defer {}
            }
            body {
                header {
                    strong { "jobs console" }
                    @if let Some(session) = session {
                        nav {
                            a href="/" { "Overview" } " "
                            a href="/letters" { "Dead letters" } " "
                            a href="/runs" { "Bulk runs" } " "
                            a href="/cron" { "Cron" }
                            @if session.signed_in {
                                form method="post" action="/logout" class="inline" {
                                    (csrf_field(&session.csrf))
                                    button { "Sign out" }
                                }
                            }
                        }
                    }
                }
                main {
                    h1 { (title) }
                    (body)
                }
            }
        }
    };
    shown(&page.into_string())
}

/// The hidden field that carries the session's form token in every state-changing form.
pub(crate) fn csrf_field(csrf: &str) -> Markup {
    html! { input type="hidden" name="csrf" value=(csrf); }
}

/// `rendered` with every character that would change or hide what is around it shown as
/// `[U+XXXX]`, and every `'` as `&#39;` (maud escapes `&`, `<`, `>` and `"`; the console's
/// attributes are double-quoted, so a `'` is text wherever it stands). The page's own markup
/// holds no such character, so whatever this changes came from a value.
fn shown(rendered: &str) -> String {
    let mut out = String::with_capacity(rendered.len());
    for c in rendered.chars() {
        match c {
            '\'' => out.push_str("&#39;"),
            c if hidden(c) => {
                let _ = write!(out, "[U+{:04X}]", u32::from(c));
            }
            c => out.push(c),
        }
    }
    out
}

/// Whether `c` would change or hide what is around it instead of showing itself: control
/// characters but the line break and the tab, bidirectional overrides and isolates (a
/// `U+202E` in an error would make it read backwards), zero-width characters and line
/// separators.
fn hidden(c: char) -> bool {
    (c.is_control() && c != '\n' && c != '\t')
        || matches!(
            c,
            '\u{061C}'
                | '\u{200B}'..='\u{200F}'
                | '\u{2028}'..='\u{202E}'
                | '\u{2060}'..='\u{2069}'
                | '\u{FEFF}'
        )
}

/// The first line of `text`, at most `max` characters (then `…`): a letter's own error in a
/// list row.
pub(crate) fn first_line(text: &str, max: usize) -> String {
    let line = text.lines().next().unwrap_or_default();
    match line.char_indices().nth(max) {
        Some((end, _)) => format!("{}…", &line[..end]),
        None => line.to_owned(),
    }
}

/// A console link: `path` with `pairs` as its query string, each value encoded, the pairs
/// without a value left out.
pub(crate) fn link<'a>(
    path: &str,
    pairs: impl IntoIterator<Item = (&'a str, Option<&'a str>)>,
) -> String {
    let mut query = form_urlencoded::Serializer::new(String::new());
    for (name, value) in pairs {
        if let Some(value) = value {
            query.append_pair(name, value);
        }
    }
    let query = query.finish();
    if query.is_empty() {
        path.to_owned()
    } else {
        format!("{path}?{query}")
    }
}

/// The first line of an error, with what varies between occurrences of the same failure
/// (UUIDs, numbers, quoted values) replaced by `{}`, so that 412 letters of "customer 17 not
/// found", "customer 23 not found", … group as one.
pub(crate) fn normalise_error(error: &str) -> String {
    let line = error.lines().next().unwrap_or("").trim();
    let chars: Vec<char> = line.chars().collect();
    let mut out = String::with_capacity(line.len());
    let mut i = 0;
    while i < chars.len() {
        let c = chars[i];
        if (c == '"' || c == '\'' || c == '`')
            && let Some(end) = chars[i + 1..].iter().position(|&d| d == c)
        {
            out.push_str("{}");
            i += end + 2;
            continue;
        }
        if c.is_ascii_hexdigit() && !prev_is_word(&chars, i) {
            let run = chars[i..]
                .iter()
                .take_while(|d| d.is_ascii_hexdigit() || **d == '-')
                .count();
            let token: String = chars[i..i + run].iter().collect();
            let uuid_like = run >= 32 && token.chars().filter(|d| *d == '-').count() == 4;
            let number = token.chars().all(|d| d.is_ascii_digit());
            if uuid_like || (number && !next_is_word(&chars, i + run)) {
                let mut end = i + run;
                // A decimal part belongs to the number.
                if number && chars.get(end) == Some(&'.') {
                    end += 1 + chars[end + 1..]
                        .iter()
                        .take_while(|d| d.is_ascii_digit())
                        .count();
                }
                out.push_str("{}");
                i = end;
                continue;
            }
        }
        out.push(c);
        i += 1;
    }
    let mut short: String = out.chars().take(200).collect();
    if out.chars().count() > 200 {
        short.push('…');
    }
    short
}

fn prev_is_word(chars: &[char], i: usize) -> bool {
    i > 0 && (chars[i - 1].is_alphanumeric() || chars[i - 1] == '_')
}

fn next_is_word(chars: &[char], i: usize) -> bool {
    chars.get(i).is_some_and(|c| c.is_alphabetic() || *c == '_')
}

/// Raw bytes for people: the text when it is UTF-8 without control characters (but line
/// breaks and tabs), else a hex dump of 16 bytes a line with offsets.
pub(crate) fn raw_bytes(bytes: &[u8]) -> (bool, String) {
    if let Ok(text) = std::str::from_utf8(bytes)
        && text
            .chars()
            .all(|c| !c.is_control() || matches!(c, '\n' | '\r' | '\t'))
    {
        return (true, text.to_owned());
    }
    let mut out = String::new();
    for (n, line) in bytes.chunks(16).enumerate() {
        let _ = write!(out, "{:08x} ", n * 16);
        for b in line {
            let _ = write!(out, " {b:02x}");
        }
        out.push('\n');
    }
    (false, out)
}

/// The points of a sparkline of `samples` in a 100 × 30 box, the highest at the top (what
/// the script draws too, from `/queues.json`).
pub(crate) fn spark(samples: &[u64]) -> String {
    let most = samples.iter().copied().max().unwrap_or(0).max(1) as f64;
    let step = if samples.len() > 1 {
        100.0 / (samples.len() - 1) as f64
    } else {
        0.0
    };
    samples
        .iter()
        .enumerate()
        .map(|(i, n)| {
            format!(
                "{:.1},{:.1}",
                i as f64 * step,
                30.0 - (*n as f64 / most) * 28.0
            )
        })
        .collect::<Vec<_>>()
        .join(" ")
}

/// The stylesheet, served at `/assets/console.css`.
pub(crate) const CSS: &str = "\
body{font:14px/1.45 system-ui,sans-serif;margin:0;color:#1d2327;background:#f6f7f7}\
header{display:flex;gap:1.5em;align-items:center;padding:.6em 1.2em;background:#1d2327;color:#fff}\
header a{color:#c3e1ff;margin-right:1em}nav{display:flex;align-items:center;gap:.2em}\
main{padding:1em 1.5em;max-width:80em}h1{font-size:1.35em}h2{font-size:1.1em;margin-top:1.6em}\
table{border-collapse:collapse;width:100%;background:#fff}\
th,td{text-align:left;padding:.35em .6em;border-bottom:1px solid #dcdcde;vertical-align:top}\
th{background:#f0f0f1;font-weight:600}td.n{text-align:right;font-variant-numeric:tabular-nums}\
pre{background:#fff;border:1px solid #dcdcde;padding:.8em;overflow:auto;max-height:30em}\
form.inline{display:inline;margin:0 .3em}form.filters{display:flex;flex-wrap:wrap;gap:.5em;\
margin:.5em 0 1em}label{display:flex;flex-direction:column;font-size:.85em}\
button{padding:.3em .9em;cursor:pointer}button.danger{color:#b32d2e}\
.status{padding:.1em .5em;border-radius:.8em;background:#dcdcde;font-size:.85em}\
.status-pending_review{background:#fcf0c3}.status-replayed{background:#d1f0d9}\
.status-discarded{background:#e5e5e5}.note{color:#646970}.error{color:#b32d2e}\
dl{display:grid;grid-template-columns:max-content 1fr;gap:.3em 1.2em}dt{font-weight:600}\
svg.spark{width:10em;height:1.6em;vertical-align:middle}svg.spark polyline{fill:none;\
stroke:#2271b1;stroke-width:1.5}";

/// The only script, served at `/assets/console.js`: the overview's queue table refreshes from
/// `/queues.json` every 5 s, with each queue's depth over the last minutes as the console
/// sampled it. Confirmation of actions is the server's own page, so nothing else needs script.
pub(crate) const JS: &str = r#"
(function () {
  const table = document.getElementById('queues');
  if (!table) return;
  function spark(points) {
    const max = Math.max(1, ...points);
    const step = points.length > 1 ? 100 / (points.length - 1) : 0;
    return points.map((p, i) => (i * step).toFixed(1) + ',' + (30 - (p / max) * 28).toFixed(1)).join(' ');
  }
  async function refresh() {
    try {
      const answer = await fetch('/queues.json', { credentials: 'same-origin' });
      if (!answer.ok) return;
      const queues = await answer.json();
      for (const q of queues) {
        const row = table.querySelector('tr[data-queue="' + CSS.escape(q.queue) + '"]');
        if (!row) continue;
        for (const field of ['ready', 'delayed', 'in_flight', 'waited']) {
          const cell = row.querySelector('[data-field="' + field + '"]');
          if (cell) cell.textContent = q[field] === null ? '-' : String(q[field]);
        }
        const line = row.querySelector('polyline');
        if (line && q.history.length) line.setAttribute('points', spark(q.history));
      }
      const stamp = document.getElementById('refreshed');
      if (stamp) stamp.textContent = new Date().toLocaleTimeString();
    } catch (e) { /* the next tick tries again */ }
  }
  refresh();
  setInterval(refresh, 5000);
})();
"#;

#[cfg(test)]
mod tests {
    use super::*;

    /// `text` as a page shows it.
    fn rendered(text: &str) -> String {
        shown(&html! { (text) }.into_string())
    }

    #[test]
    fn escaping_leaves_no_markup() {
        assert_eq!(
            rendered("<script>alert('x')</script> & \"q\""),
            "&lt;script&gt;alert(&#39;x&#39;)&lt;/script&gt; &amp; &quot;q&quot;"
        );
    }

    #[test]
    fn control_and_bidi_characters_are_shown_not_obeyed() {
        assert_eq!(
            rendered("paid\u{202E}dias\u{0007} ok\u{200B}!\nnext\tcol"),
            "paid[U+202E]dias[U+0007] ok[U+200B]!\nnext\tcol"
        );
        assert_eq!(rendered("\u{2066}x\u{2069}\r"), "[U+2066]x[U+2069][U+000D]");
        assert_eq!(rendered("naïve, 日本"), "naïve, 日本", "other letters pass");
    }

    #[test]
    fn a_value_cannot_leave_its_attribute() {
        let field = shown(&csrf_field("x\" onclick=\"alert(1)").into_string());
        assert_eq!(
            field,
            "<input type=\"hidden\" name=\"csrf\" value=\"x&quot; onclick=&quot;alert(1)\">"
        );
    }

    #[test]
    fn errors_group_without_what_varies() {
        for (error, expected) in [
            ("customer 17 not found", "customer {} not found"),
            (
                "customer 2301 not found\nat line 3",
                "customer {} not found",
            ),
            (
                "invoice 0192f0a4-8d7e-7c3b-a1f2-6e5d4c3b2a19 missing",
                "invoice {} missing",
            ),
            ("bad field 'email' in \"x y\"", "bad field {} in {}"),
            ("took 1.5 s", "took {} s"),
            ("http2 error: status 503", "http2 error: status {}"),
            ("deadbeef is not a word here", "deadbeef is not a word here"),
        ] {
            assert_eq!(normalise_error(error), expected, "{error}");
        }
    }

    #[test]
    fn raw_bytes_are_text_when_printable_else_hex() {
        assert_eq!(raw_bytes(b"{\"a\":1}\n"), (true, "{\"a\":1}\n".to_owned()));
        let (text, dump) = raw_bytes(&[0x00, 0xff, b'a']);
        assert!(!text);
        assert_eq!(dump, "00000000  00 ff 61\n");
    }

    #[test]
    fn a_sparkline_spans_the_box_with_the_highest_at_the_top() {
        assert_eq!(spark(&[]), "");
        assert_eq!(spark(&[0, 5, 10]), "0.0,30.0 50.0,16.0 100.0,2.0");
        assert_eq!(spark(&[3]), "0.0,2.0");
    }

    #[test]
    fn a_first_line_is_cut_at_its_length_in_characters() {
        assert_eq!(
            first_line("customer 17 not found\nat line 3", 200),
            "customer 17 not found"
        );
        assert_eq!(first_line("ééé", 2), "éé…");
        assert_eq!(first_line("abc", 3), "abc");
        assert_eq!(first_line("", 3), "");
    }

    #[test]
    fn links_encode_their_values_and_leave_out_the_unset() {
        assert_eq!(
            link("/letters", [("queue", Some("a b&c=d/é")), ("kind", None)]),
            "/letters?queue=a+b%26c%3Dd%2F%C3%A9"
        );
        assert_eq!(link("/letters", [("queue", None)]), "/letters");
        let parsed: Vec<(String, String)> = form_urlencoded::parse(
            link("/x", [("q", Some("+ &#"))])
                .trim_start_matches("/x?")
                .as_bytes(),
        )
        .into_owned()
        .collect();
        assert_eq!(
            parsed,
            [("q".to_owned(), "+ &#".to_owned())],
            "a link round-trips"
        );
    }
}
