//! JUnit XML, the format CI systems and Kubernetes test dashboards read: one test suite
//! of test cases, each passed, failed or skipped.

use std::fmt::Write as _;

#[derive(Debug, Clone, PartialEq)]
pub enum Outcome {
    Passed,
    Failed(String),
    Skipped(String),
}

#[derive(Debug, Clone, PartialEq)]
pub struct Case {
    pub name: String,
    pub classname: String,
    pub outcome: Outcome,
    /// Shown by most viewers beside the result (what was seen, a warning...).
    pub output: String,
    pub seconds: f64,
}

fn escape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for ch in s.chars() {
        match ch {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&apos;"),
            // XML 1.0 has no way to carry other control characters.
            c if (c as u32) < 0x20 && !matches!(c, '\t' | '\n' | '\r') => out.push('?'),
            c => out.push(c),
        }
    }
    out
}

/// The document for one suite.
pub fn render(suite: &str, cases: &[Case]) -> String {
    let failures = cases.iter().filter(|c| matches!(c.outcome, Outcome::Failed(_))).count();
    let skipped = cases.iter().filter(|c| matches!(c.outcome, Outcome::Skipped(_))).count();
    let time: f64 = cases.iter().map(|c| c.seconds).sum();
    let mut x = String::from("<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n");
    let _ = writeln!(
        x,
        "<testsuites><testsuite name=\"{}\" tests=\"{}\" failures=\"{failures}\" errors=\"0\" skipped=\"{skipped}\" \
         time=\"{time:.3}\">",
        escape(suite),
        cases.len()
    );
    for c in cases {
        let _ = write!(
            x,
            "  <testcase name=\"{}\" classname=\"{}\" time=\"{:.3}\">",
            escape(&c.name),
            escape(&c.classname),
            c.seconds
        );
        match &c.outcome {
            Outcome::Passed => {}
            Outcome::Failed(m) => {
                let _ = write!(x, "<failure message=\"{}\">{}</failure>", escape(m), escape(m));
            }
            Outcome::Skipped(m) => {
                let _ = write!(x, "<skipped message=\"{}\"/>", escape(m));
            }
        }
        if !c.output.is_empty() {
            let _ = write!(x, "<system-out>{}</system-out>", escape(&c.output));
        }
        x.push_str("</testcase>\n");
    }
    x.push_str("</testsuite></testsuites>\n");
    x
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn escapes_and_counts() {
        let cases = vec![
            Case {
                name: "a<b".into(),
                classname: "x".into(),
                outcome: Outcome::Passed,
                output: "seen \"1\" & more".into(),
                seconds: 0.5,
            },
            Case {
                name: "f".into(),
                classname: "x".into(),
                outcome: Outcome::Failed("MTU 1500 <= 1500".into()),
                output: String::new(),
                seconds: 0.0,
            },
            Case {
                name: "s".into(),
                classname: "x".into(),
                outcome: Outcome::Skipped("fixture".into()),
                output: String::new(),
                seconds: 0.0,
            },
        ];
        let x = render("suite", &cases);
        assert!(x.contains("tests=\"3\" failures=\"1\" errors=\"0\" skipped=\"1\""), "{x}");
        assert!(x.contains("name=\"a&lt;b\"") && x.contains("seen &quot;1&quot; &amp; more"), "{x}");
        assert!(x.contains("<failure message=\"MTU 1500 &lt;= 1500\">"), "{x}");
        assert!(!x.contains("a<b"));
    }
}
