//! Payload patterns for `--validate-data`: message `i` has its own byte pattern, so a
//! stale, reordered or corrupted payload shows up where it lands.

fn splitmix(mut x: u64) -> u64 {
    x = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
    x = (x ^ (x >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    x ^ (x >> 31)
}

#[inline]
fn byte(seed: u64, j: usize) -> u8 {
    let lane = (seed >> ((j & 7) * 8)) as u8;
    lane ^ ((j >> 3) as u8).wrapping_mul(0x9D)
}

/// Fills `buf` with the pattern of message `i`.
pub fn fill(buf: &mut [u8], i: u64) {
    let seed = splitmix(i);
    for (j, b) in buf.iter_mut().enumerate() {
        *b = byte(seed, j);
    }
}

/// The offset of the first byte of `buf` that differs from message `i`'s pattern.
pub fn first_mismatch(buf: &[u8], i: u64) -> Option<usize> {
    let seed = splitmix(i);
    buf.iter().enumerate().position(|(j, &b)| b != byte(seed, j))
}

/// Message `i` for SEND: its index in the first 8 bytes (when they fit), then `i`'s
/// pattern. The stamp lets a receiver that may lose messages (UD) know which one arrived.
pub fn fill_stamped(buf: &mut [u8], i: u64) {
    fill(buf, i);
    if buf.len() >= 8 {
        buf[..8].copy_from_slice(&i.to_le_bytes());
    }
}

/// Checks a stamped message and returns its index. `expected` is the index arrival order
/// implies; a stamp below it means a duplicate or reordering. Messages shorter than the
/// stamp are checked as message `expected`.
pub fn check_stamped(buf: &[u8], expected: u64) -> Result<u64, String> {
    let (index, body, skip) = if buf.len() >= 8 {
        let i = u64::from_le_bytes(buf[..8].try_into().expect("8 bytes"));
        if i < expected {
            return Err(format!("message {i} arrived where message {expected} or later was due"));
        }
        (i, buf, 8)
    } else {
        (expected, buf, 0)
    };
    let seed = splitmix(index);
    match body.iter().enumerate().skip(skip).position(|(j, &b)| b != byte(seed, j)) {
        Some(p) => Err(format!("data mismatch in message {index}, byte {} of a {}-byte message", p + skip, buf.len())),
        None => Ok(index),
    }
}

/// Bytes of a ring record's stamp: its number, then a checksum of the rest.
pub const RECORD_STAMP: usize = 16;

/// FNV-1a over `bytes`: the ring records' checksum (cheap, and any single-byte change
/// alters it).
pub fn checksum(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |h, &b| (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3))
}

/// Ring record `i` (at least `RECORD_STAMP` bytes): `[i][checksum of the body]`, then the
/// body, `i`'s pattern.
pub fn fill_record(buf: &mut [u8], i: u64) {
    let (stamp, body) = buf.split_at_mut(RECORD_STAMP);
    fill(body, i);
    stamp[..8].copy_from_slice(&i.to_le_bytes());
    stamp[8..].copy_from_slice(&checksum(body).to_le_bytes());
}

/// Checks ring record `expected`: a ring loses and reorders nothing, so the stamp must be
/// exactly `expected`, the checksum must match and the body be `expected`'s pattern.
pub fn check_record(buf: &[u8], expected: u64) -> Result<(), String> {
    let word = |k: usize| u64::from_le_bytes(buf[k..k + 8].try_into().expect("8 bytes"));
    let (index, sum, body) = (word(0), word(8), &buf[RECORD_STAMP..]);
    if index != expected {
        return Err(format!("record {index} arrived where record {expected} was due (lost, duplicated or reordered)"));
    }
    if checksum(body) != sum {
        let at =
            first_mismatch(body, index).map_or(String::new(), |p| format!(", first bad byte {}", p + RECORD_STAMP));
        return Err(format!("record {index} ({} B) fails its checksum{at}", buf.len()));
    }
    match first_mismatch(body, index) {
        Some(p) => Err(format!("record {index} ({} B) has wrong data at byte {}", buf.len(), p + RECORD_STAMP)),
        None => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fill_then_check_passes_and_one_flipped_byte_is_found() {
        let mut b = vec![0u8; 4099];
        fill(&mut b, 42);
        assert_eq!(first_mismatch(&b, 42), None);
        b[1234] ^= 0x01;
        assert_eq!(first_mismatch(&b, 42), Some(1234));
    }

    #[test]
    fn stamped_messages_carry_their_index_and_catch_corruption_and_reordering() {
        let mut b = vec![0u8; 100];
        fill_stamped(&mut b, 77);
        assert_eq!(check_stamped(&b, 70), Ok(77), "a gap (loss) is allowed");
        assert!(check_stamped(&b, 78).unwrap_err().contains("arrived where"));
        b[50] ^= 1;
        assert!(check_stamped(&b, 77).unwrap_err().contains("byte 50"));
        let mut short = vec![0u8; 5];
        fill_stamped(&mut short, 3);
        assert_eq!(check_stamped(&short, 3), Ok(3));
        assert!(check_stamped(&short, 4).is_err());
    }

    #[test]
    fn neighbouring_messages_differ_so_stale_data_is_caught() {
        let mut a = vec![0u8; 64];
        fill(&mut a, 7);
        assert_eq!(first_mismatch(&a, 8), Some(0).or(first_mismatch(&a, 8)));
        assert!(first_mismatch(&a, 8).is_some());
        assert!(first_mismatch(&a, 6).is_some());
    }

    #[test]
    fn ring_records_carry_number_and_checksum() {
        let mut b = vec![0u8; 64];
        fill_record(&mut b, 9);
        assert_eq!(check_record(&b, 9), Ok(()));
        assert!(check_record(&b, 10).unwrap_err().contains("record 9 arrived where record 10"));
        b[40] ^= 4;
        let e = check_record(&b, 9).unwrap_err();
        assert!(e.contains("checksum") && e.contains("byte 40"), "{e}");
        let mut bare = vec![0u8; RECORD_STAMP];
        fill_record(&mut bare, 3);
        assert_eq!(check_record(&bare, 3), Ok(()));
    }
}
