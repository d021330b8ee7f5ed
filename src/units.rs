//! Units shared by every flag, workload key and report: byte counts with binary suffixes
//! (one parser, so `-s 64K`, `--capacity 64K` and `size = "64K"` mean the same), and
//! figures rounded to significant digits (so a message rate of 0.0009 Mpps is not "0.000").
//! Pure: depends on nothing else in the crate.

use std::fmt;

use serde::{Deserialize, Deserializer};

/// The suffixes a byte count accepts, for messages.
pub const BYTE_SUFFIXES: &str = "K, M, G, T (binary: KiB, MiB, GiB, TiB and KB, MB, GB, TB mean the same)";

/// A byte count: `65536`, `64K`, `64KiB`, `64KB`, `1M`, `2G`, `1T` (binary multiples; case
/// does not matter). Zero is a valid count here; each flag's own range check refuses it
/// where it means nothing.
pub fn parse_bytes(s: &str) -> Result<u64, String> {
    let t = s.trim();
    let digits = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
    let (num, unit) = t.split_at(digits);
    let n: u64 = num.parse().map_err(|_| format!("{s:?} is not a byte count; use a number with {BYTE_SUFFIXES}"))?;
    let shift = match unit.trim().to_ascii_uppercase().as_str() {
        "" | "B" => 0,
        "K" | "KB" | "KIB" => 10,
        "M" | "MB" | "MIB" => 20,
        "G" | "GB" | "GIB" => 30,
        "T" | "TB" | "TIB" => 40,
        _ => return Err(format!("{s:?}: unknown unit {unit:?}; use {BYTE_SUFFIXES}, e.g. 64K")),
    };
    n.checked_mul(1 << shift).ok_or_else(|| format!("{s:?} is too large; at most 16 EiB"))
}

/// A byte count that must fit a 32-bit field (inline size, MTU).
pub fn parse_bytes_u32(s: &str) -> Result<u32, String> {
    Bytes(parse_bytes(s)?).to_u32().map_err(|e| format!("{s:?}: {e}"))
}

/// A workload file's byte-valued key: an integer (`size = 65536`) or a string with a
/// suffix (`size = "64K"`), parsed by [`parse_bytes`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Bytes(pub u64);

impl<'de> Deserialize<'de> for Bytes {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        #[derive(Deserialize)]
        #[serde(untagged)]
        enum Raw {
            Number(i64),
            Text(String),
        }
        let raw = Raw::deserialize(d).map_err(|_| {
            serde::de::Error::custom(format!("expected a byte count: a number, or a string with {BYTE_SUFFIXES}"))
        })?;
        match raw {
            Raw::Number(n) => u64::try_from(n)
                .map(Bytes)
                .map_err(|_| serde::de::Error::custom(format!("{n} is negative; a byte count is 0 or more"))),
            Raw::Text(t) => parse_bytes(&t).map(Bytes).map_err(serde::de::Error::custom),
        }
    }
}

impl Bytes {
    /// The count as a 32-bit field, or the reason it does not fit.
    pub fn to_u32(self) -> Result<u32, String> {
        u32::try_from(self.0).map_err(|_| format!("{} B is too large; at most {} B", self.0, u32::MAX))
    }
}

/// `x` rounded to `digits` significant digits, without exponent: 61.7 -> "61.70",
/// 0.000938 -> "0.0009380", 123456.0 -> "123456" (never fewer digits than the integer part has).
pub fn significant(x: f64, digits: u32) -> String {
    if !x.is_finite() {
        return format!("{x}");
    }
    if x == 0.0 {
        return "0".into();
    }
    let magnitude = x.abs().log10().floor() as i32;
    let decimals = (digits as i32 - 1 - magnitude).max(0) as usize;
    format!("{x:.decimals$}")
}

/// [`significant`] with 4 digits, for `format!`: `Sig(x)`.
#[derive(Debug, Clone, Copy)]
pub struct Sig(pub f64);

impl fmt::Display for Sig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.pad(&significant(self.0, 4))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn byte_counts_take_every_binary_suffix() {
        for (text, want) in [
            ("65536", 65536),
            ("64K", 65536),
            ("64k", 65536),
            ("64KiB", 65536),
            ("64kib", 65536),
            ("64KB", 65536),
            ("64 K", 65536),
            ("8M", 8 << 20),
            ("8MiB", 8 << 20),
            ("1G", 1 << 30),
            ("1GiB", 1 << 30),
            ("2T", 2 << 40),
            ("0", 0),
            ("12B", 12),
        ] {
            assert_eq!(parse_bytes(text), Ok(want), "{text}");
        }
    }

    #[test]
    fn bad_byte_counts_say_what_is_accepted() {
        for bad in ["", "K", "-1", "1.5M", "64X", "64 KiBs", "99999999999999999999"] {
            let e = parse_bytes(bad).unwrap_err();
            assert!(e.contains(&format!("{bad:?}")), "{e}");
        }
        assert!(parse_bytes("64X").unwrap_err().contains("KiB"));
        assert!(parse_bytes("20000000T").unwrap_err().contains("too large"));
        assert!(parse_bytes_u32("4G").unwrap_err().contains("4294967295"));
        assert_eq!(parse_bytes_u32("4K"), Ok(4096));
    }

    #[test]
    fn workload_byte_keys_take_numbers_and_suffixed_strings() {
        #[derive(Deserialize)]
        struct K {
            a: Bytes,
            b: Bytes,
            c: Vec<Bytes>,
        }
        let k: K = toml::from_str("a = 4096\nb = \"64K\"\nc = [2, \"1M\", \"8MiB\"]").unwrap();
        assert_eq!((k.a, k.b), (Bytes(4096), Bytes(65536)));
        assert_eq!(k.c, vec![Bytes(2), Bytes(1 << 20), Bytes(8 << 20)]);
        let e = toml::from_str::<K>("a = \"64Q\"\nb = 1\nc = []").err().unwrap().to_string();
        assert!(e.contains("unknown unit"), "{e}");
        let e = toml::from_str::<K>("a = -4\nb = 1\nc = []").err().unwrap().to_string();
        assert!(e.contains("negative"), "{e}");
        let e = toml::from_str::<K>("a = 1.5\nb = 1\nc = []").err().unwrap().to_string();
        assert!(e.contains("byte count"), "{e}");
    }

    #[test]
    fn significant_digits_show_small_and_large_figures() {
        assert_eq!(significant(61.7, 4), "61.70");
        assert_eq!(significant(13.6, 4), "13.60");
        assert_eq!(significant(0.000938, 4), "0.0009380");
        assert_eq!(significant(0.00093, 4), "0.0009300");
        assert_eq!(significant(0.19, 4), "0.1900");
        assert_eq!(significant(123456.0, 4), "123456");
        assert_eq!(significant(-2.5, 4), "-2.500");
        assert_eq!(significant(0.0, 4), "0");
        // A change of 0.1 % at 0.0009 Mpps is visible.
        assert_ne!(significant(0.0009380, 4), significant(0.0009390, 4));
        assert_eq!(format!("{:>10}", Sig(1.0)), "     1.000");
    }
}
