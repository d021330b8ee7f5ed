//! Generated sections of hand-written documents (README tables made from the code): the
//! text between two marker lines is replaced, the rest kept.

/// `text` with what lies between `begin` and `end` replaced by `body` (the markers kept,
/// `body` placed on the line after `begin`); None when a marker is missing or out of order.
pub fn replace_between(text: &str, begin: &str, end: &str, body: &str) -> Option<String> {
    let start = text.find(begin)? + begin.len();
    let stop = text[start..].find(end)? + start;
    let sep = if begin.ends_with('\n') { "" } else { "\n" };
    Some(format!("{}{sep}{body}{}", &text[..start], &text[stop..]))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn replaces_only_between_the_markers() {
        let t = "a\n<!-- b -->\nold\n<!-- e -->\nz\n";
        assert_eq!(
            replace_between(t, "<!-- b -->", "<!-- e -->", "new\n").unwrap(),
            "a\n<!-- b -->\nnew\n<!-- e -->\nz\n"
        );
        assert_eq!(
            replace_between(t, "<!-- b -->\n", "<!-- e -->", "new\n").unwrap(),
            "a\n<!-- b -->\nnew\n<!-- e -->\nz\n"
        );
        assert_eq!(replace_between(t, "<!-- e -->", "<!-- b -->", "x"), None, "out of order");
        assert_eq!(replace_between(t, "<!-- q -->", "<!-- e -->", "x"), None);
    }
}
