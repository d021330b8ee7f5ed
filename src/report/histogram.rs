//! `--histogram FILE`: every size's latency histogram in HdrHistogram's interval-log
//! format (V2, base64), one entry per size tagged `size=N`, for HdrHistogram's plotting
//! tools. Values are round-trip nanoseconds, unhalved, as the samples were taken.

use hdrhistogram::Histogram;
use hdrhistogram::serialization::interval_log::{IntervalLogIterator, IntervalLogWriterBuilder, LogEntry, Tag};
use hdrhistogram::serialization::{Deserializer, V2Serializer};

use crate::error::{Error, Result};

pub struct SizeHistogram {
    pub size: u64,
    pub histogram: Histogram<u64>,
    pub duration_ns: u64,
}

pub fn write(path: &str, test: &str, sizes: &[SizeHistogram]) -> Result<()> {
    let fail = |e: String| Error::Environment(format!("cannot write the histogram file {path}: {e}"));
    let mut out = Vec::new();
    let mut serializer = V2Serializer::new();
    {
        let mut log = IntervalLogWriterBuilder::new()
            .add_comment(&format!("rdmabench {} {test}", env!("CARGO_PKG_VERSION")))
            .add_comment("values: round-trip latency in nanoseconds (write/send report one-way = value / 2)")
            .with_start_time(std::time::SystemTime::now())
            .begin_log_with(&mut out, &mut serializer)
            .map_err(|e| fail(e.to_string()))?;
        let mut start = std::time::Duration::ZERO;
        for s in sizes {
            let tag = format!("size={}", s.size);
            let duration = std::time::Duration::from_nanos(s.duration_ns);
            log.write_histogram(&s.histogram, start, duration, Tag::new(&tag)).map_err(|e| fail(format!("{e:?}")))?;
            start += duration;
        }
    }
    super::file::write(path, &out, "the histogram log")
}

/// Reads a file `write` wrote: each entry's tag (`size=N`) and histogram.
pub fn read(path: &str) -> Result<Vec<(String, Histogram<u64>)>> {
    let bytes = std::fs::read(path).map_err(|e| Error::Usage(format!("cannot read {path}: {e}")))?;
    let mut out = Vec::new();
    for entry in IntervalLogIterator::new(&bytes) {
        match entry {
            Ok(LogEntry::Interval(i)) => {
                let raw = base64_decode(i.encoded_histogram())
                    .ok_or_else(|| Error::Usage(format!("{path}: an entry is not base64")))?;
                let h: Histogram<u64> = Deserializer::new()
                    .deserialize(&mut raw.as_slice())
                    .map_err(|e| Error::Usage(format!("{path}: a histogram does not decode: {e:?}")))?;
                out.push((i.tag().map_or(String::new(), |t| t.as_str().to_string()), h));
            }
            Ok(_) => {}
            Err(e) => return Err(Error::Usage(format!("{path} is not an HdrHistogram interval log: {e:?}"))),
        }
    }
    Ok(out)
}

fn base64_decode(s: &str) -> Option<Vec<u8>> {
    const T: &[u8] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = Vec::new();
    let (mut acc, mut bits) = (0u32, 0);
    for c in s.bytes().filter(|&c| c != b'=') {
        acc = (acc << 6) | T.iter().position(|&t| t == c)? as u32;
        bits += 6;
        if bits >= 8 {
            bits -= 8;
            out.push((acc >> bits) as u8);
        }
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_size_reads_back_with_its_tag_and_counts() {
        let mut sizes = Vec::new();
        for (size, n) in [(2u64, 100u64), (4096, 50)] {
            let mut h = Histogram::<u64>::new_with_bounds(1, 3_600_000_000_000, 3).unwrap();
            for v in 0..n {
                h.record(10_000 + v).unwrap();
            }
            sizes.push(SizeHistogram { size, histogram: h, duration_ns: 1_000_000 });
        }
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("h.hlog");
        write(path.to_str().unwrap(), "write_lat", &sizes).unwrap();
        let seen: Vec<(String, u64)> =
            read(path.to_str().unwrap()).unwrap().into_iter().map(|(tag, h)| (tag, h.len())).collect();
        assert_eq!(seen, vec![("size=2".to_string(), 100), ("size=4096".to_string(), 50)]);
    }
}
