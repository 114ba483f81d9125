//! Plain-text tables and key/value blocks for `agent model`.

use std::fmt::Write;

/// Columns padded to their widest cell; the first column left-aligned, the rest right.
pub(crate) struct Table {
    headers: Vec<String>,
    rows: Vec<Vec<String>>,
}

impl Table {
    pub(crate) fn new(headers: &[&str]) -> Table {
        Table { headers: headers.iter().map(|h| h.to_string()).collect(), rows: Vec::new() }
    }

    pub(crate) fn row(&mut self, cells: Vec<String>) -> &mut Table {
        self.rows.push(cells);
        self
    }

    pub(crate) fn render(&self) -> String {
        let n = self.headers.len();
        let mut width: Vec<usize> = self.headers.iter().map(|h| h.chars().count()).collect();
        for r in &self.rows {
            for (i, c) in r.iter().enumerate().take(n) {
                width[i] = width[i].max(c.chars().count());
            }
        }
        let mut out = String::new();
        let line = |cells: &[String], out: &mut String| {
            let mut s = String::new();
            for (i, c) in cells.iter().enumerate().take(n) {
                let pad = width[i].saturating_sub(c.chars().count());
                if i > 0 {
                    s.push_str("  ");
                }
                if i == 0 {
                    s.push_str(c);
                    s.push_str(&" ".repeat(pad));
                } else {
                    s.push_str(&" ".repeat(pad));
                    s.push_str(c);
                }
            }
            out.push_str(s.trim_end());
            out.push('\n');
        };
        line(&self.headers, &mut out);
        let rule: Vec<String> = width.iter().map(|&w| "-".repeat(w)).collect();
        line(&rule, &mut out);
        for r in &self.rows {
            line(r, &mut out);
        }
        out
    }
}

/// `key  value` lines with the keys padded to the same width.
pub(crate) fn kv(pairs: &[(&str, String)]) -> String {
    let w = pairs.iter().map(|(k, _)| k.chars().count()).max().unwrap_or(0);
    let mut out = String::new();
    for (k, v) in pairs {
        let pad = w - k.chars().count();
        let _ = writeln!(out, "{k}{}  {v}", " ".repeat(pad));
    }
    out
}

/// `0.4` → `40.0 %`.
pub(crate) fn pct(x: f64) -> String {
    format!("{:.1} %", x * 100.0)
}

/// A title line followed by a blank line.
pub(crate) fn title(s: &str) -> String {
    format!("{s}\n\n")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn aligns_columns() {
        let mut t = Table::new(&["a", "bb"]);
        t.row(vec!["long".into(), "1".into()]);
        assert_eq!(t.render(), "a     bb\n----  --\nlong   1\n");
        assert_eq!(kv(&[("x", "1".into()), ("yyy", "2".into())]), "x    1\nyyy  2\n");
        assert_eq!(pct(0.4), "40.0 %");
    }
}
