//! The shared secret of the control channel. A server with a token greets every
//! connection with a fresh nonce; the client answers in its hello (or finish) with
//! HMAC-SHA256(token, nonce and the message's kind), so the token itself never crosses
//! the wire and a captured proof does not open another session. It authenticates the
//! client; it does not encrypt the channel.

use std::fmt;
use std::path::Path;

use hmac::{Hmac, Mac};
use sha2::Sha256;

use crate::error::{Error, Result};

/// The environment variable that may hold the token (the Jobs fill it from a Secret).
pub const TOKEN_ENV: &str = "RDMABENCH_TOKEN";
/// Shorter secrets are refused: they can be guessed offline from one captured proof.
pub const MIN_TOKEN_BYTES: usize = 16;
/// Bytes of randomness in a nonce.
const NONCE_BYTES: usize = 16;

/// The shared secret. Debug and Display never show it.
#[derive(Clone, PartialEq, Eq)]
pub struct Token(Vec<u8>);

impl fmt::Debug for Token {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Token(..)")
    }
}

impl Token {
    /// A token from its text: surrounding whitespace (a file's final newline) is not part of it.
    pub fn new(text: &str, source: &str) -> Result<Token> {
        let t = text.trim();
        if t.len() < MIN_TOKEN_BYTES {
            return Err(Error::Usage(format!(
                "the token from {source} has {} bytes; use at least {MIN_TOKEN_BYTES}, e.g. `head -c 32 /dev/urandom \
                 | base64 > token`",
                t.len()
            )));
        }
        Ok(Token(t.as_bytes().to_vec()))
    }

    /// `--token-file` if given, else `$RDMABENCH_TOKEN` if set, else none (no authentication).
    pub fn configured(file: Option<&Path>) -> Result<Option<Token>> {
        if let Some(path) = file {
            let text = std::fs::read_to_string(path).map_err(|e| {
                Error::Usage(format!("--token-file {}: cannot read it: {e}; give a readable file", path.display()))
            })?;
            return Token::new(&text, &format!("--token-file {}", path.display())).map(Some);
        }
        match std::env::var(TOKEN_ENV) {
            Ok(text) => Token::new(&text, &format!("${TOKEN_ENV}")).map(Some),
            Err(std::env::VarError::NotPresent) => Ok(None),
            Err(e) => Err(Error::Usage(format!("${TOKEN_ENV}: {e}"))),
        }
    }

    fn mac(&self, nonce: &str, kind: &str) -> Hmac<Sha256> {
        let mut mac = Hmac::<Sha256>::new_from_slice(&self.0).expect("HMAC takes a key of any length");
        mac.update(b"rdmabench\0");
        mac.update(kind.as_bytes());
        mac.update(b"\0");
        mac.update(nonce.as_bytes());
        mac
    }

    /// The proof a client sends with a message of `kind` after the greeting's `nonce`.
    pub fn proof(&self, nonce: &str, kind: &str) -> String {
        hex(&self.mac(nonce, kind).finalize().into_bytes())
    }

    /// Whether `proof` answers `nonce` for `kind` (compared in constant time).
    pub fn verify(&self, nonce: &str, kind: &str, proof: &str) -> bool {
        match unhex(proof) {
            Some(bytes) => self.mac(nonce, kind).verify_slice(&bytes).is_ok(),
            None => false,
        }
    }
}

/// A fresh nonce for a greeting.
pub fn nonce() -> Result<String> {
    random_hex(NONCE_BYTES)
}

/// `n` bytes from the kernel's random source, as hex.
pub fn random_hex(n: usize) -> Result<String> {
    let mut bytes = vec![0u8; n];
    let got = std::fs::File::open("/dev/urandom").and_then(|mut f| std::io::Read::read_exact(&mut f, &mut bytes));
    got.map_err(|e| Error::Environment(format!("cannot read /dev/urandom: {e}")))?;
    Ok(hex(&bytes))
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn unhex(s: &str) -> Option<Vec<u8>> {
    if !s.len().is_multiple_of(2) || s.len() > 128 {
        return None;
    }
    (0..s.len()).step_by(2).map(|i| u8::from_str_radix(s.get(i..i + 2)?, 16).ok()).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn token() -> Token {
        Token::new("correct horse battery staple\n", "test").unwrap()
    }

    #[test]
    fn a_proof_verifies_only_for_its_nonce_kind_and_token() {
        let t = token();
        let p = t.proof("n1", "hello");
        assert!(t.verify("n1", "hello", &p));
        assert!(!t.verify("n2", "hello", &p), "another nonce: a replayed proof");
        assert!(!t.verify("n1", "finish", &p), "a hello's proof cannot finish the server");
        let other = Token::new("another secret of enough length", "test").unwrap();
        assert!(!other.verify("n1", "hello", &p));
        assert!(!t.verify("n1", "hello", "zz"), "not hex");
        assert!(!t.verify("n1", "hello", ""), "empty");
        assert!(!t.verify("n1", "hello", &"0".repeat(100_000)), "oversized");
    }

    #[test]
    fn the_token_is_trimmed_and_short_ones_are_refused_naming_the_minimum() {
        assert_eq!(token(), Token::new("  correct horse battery staple", "x").unwrap());
        let e = Token::new("short\n", "--token-file t").unwrap_err();
        assert_eq!(e.exit_code(), 2);
        assert!(e.to_string().contains("at least 16") && e.to_string().contains("--token-file t"), "{e}");
        assert_eq!(format!("{:?}", token()), "Token(..)", "never printed");
    }

    #[test]
    fn nonces_are_fresh_hex() {
        let (a, b) = (nonce().unwrap(), nonce().unwrap());
        assert_ne!(a, b);
        assert_eq!(a.len(), 32);
        assert_eq!(unhex(&a).unwrap().len(), 16);
    }
}
