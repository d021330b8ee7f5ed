//! `rdmabench plot`: SVG charts of a result, written directly (no plotting dependency):
//! bandwidth against message size, latency percentiles against message size, and a
//! latency CDF from a `--histogram` file. Sizes are on a log2 axis, latencies on a log10
//! axis when they span more than a decade.

use std::fmt::Write as _;

use crate::error::{Error, Result};
use crate::report::run::{self as doc, RunDocument};

const W: f64 = 760.0;
const H: f64 = 400.0;
const M_LEFT: f64 = 80.0;
const M_RIGHT: f64 = 190.0;
const M_TOP: f64 = 40.0;
const M_BOTTOM: f64 = 55.0;
const COLORS: &[&str] = &["#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2", "#17becf"];

#[derive(Debug, Clone)]
pub struct Series {
    pub name: String,
    pub points: Vec<(f64, f64)>,
}

#[derive(Debug, Clone)]
pub struct Chart {
    pub title: String,
    pub x_label: String,
    pub y_label: String,
    /// Message sizes: log2 axis with byte labels.
    pub x_log2: bool,
    pub series: Vec<Series>,
    /// Vertical marks with a label (a history's change points), at x.
    pub marks: Vec<(f64, String)>,
}

fn bytes_label(v: f64) -> String {
    let b = v.round() as u64;
    match b {
        b if b >= 1 << 20 && b % (1 << 20) == 0 => format!("{}M", b >> 20),
        b if b >= 1 << 10 && b % (1 << 10) == 0 => format!("{}K", b >> 10),
        b => b.to_string(),
    }
}

fn number_label(v: f64) -> String {
    if v == 0.0 {
        "0".into()
    } else if v.abs() >= 100.0 {
        format!("{v:.0}")
    } else if v.abs() >= 1.0 {
        format!("{v:.1}")
    } else {
        format!("{v:.3}")
    }
}

/// Round tick spacing for a linear axis of `span`.
fn nice_step(span: f64) -> f64 {
    let raw = span / 5.0;
    let mag = 10f64.powf(raw.log10().floor());
    [1.0, 2.0, 2.5, 5.0, 10.0].iter().map(|m| m * mag).find(|s| *s >= raw).unwrap_or(10.0 * mag)
}

fn esc(s: &str) -> String {
    s.replace('&', "&amp;").replace('<', "&lt;").replace('>', "&gt;")
}

impl Chart {
    /// The chart as an SVG group placed at vertical offset `y0`.
    fn render(&self, y0: f64) -> String {
        let pts: Vec<(f64, f64)> = self.series.iter().flat_map(|s| s.points.iter().copied()).collect();
        let mut g = format!("<g transform=\"translate(0,{y0})\">\n");
        let _ = writeln!(
            g,
            "<text x=\"{}\" y=\"24\" font-size=\"16\" font-weight=\"bold\">{}</text>",
            M_LEFT,
            esc(&self.title)
        );
        if pts.is_empty() {
            let _ = writeln!(g, "<text x=\"{M_LEFT}\" y=\"80\">no data</text></g>");
            return g;
        }
        let fx = |x: f64| if self.x_log2 { x.max(1.0).log2() } else { x };
        let (mut x0, mut x1) = pts.iter().fold((f64::MAX, f64::MIN), |(a, b), p| (a.min(fx(p.0)), b.max(fx(p.0))));
        if x1 <= x0 {
            x0 -= 1.0;
            x1 += 1.0;
        }
        let ymax = pts.iter().map(|p| p.1).fold(0.0, f64::max);
        let ymin = pts.iter().map(|p| p.1).fold(f64::MAX, f64::min);
        let log_y = ymin > 0.0 && ymax / ymin > 20.0;
        let fy = |y: f64| if log_y { y.max(1e-12).log10() } else { y };
        let (y0v, y1v) = if log_y { (fy(ymin).floor(), fy(ymax).ceil()) } else { (0.0, (ymax * 1.1).max(1e-9)) };
        let (pw, ph) = (W - M_LEFT - M_RIGHT, H - M_TOP - M_BOTTOM);
        let px = |x: f64| M_LEFT + (fx(x) - x0) / (x1 - x0) * pw;
        let py = |y: f64| M_TOP + ph - (fy(y) - y0v) / (y1v - y0v).max(1e-12) * ph;
        let _ = writeln!(
            g,
            "<rect x=\"{M_LEFT}\" y=\"{M_TOP}\" width=\"{pw}\" height=\"{ph}\" fill=\"none\" stroke=\"#333\"/>"
        );
        // X ticks: powers of two (every other one when crowded) or 5 linear ones.
        let xticks: Vec<f64> = if self.x_log2 {
            let every = if x1 - x0 > 12.0 { 2 } else { 1 };
            (x0.ceil() as i64..=x1.floor() as i64).filter(|e| e % every == 0).map(|e| 2f64.powi(e as i32)).collect()
        } else {
            let step = nice_step(x1 - x0);
            (0..=((x1 - x0) / step) as i64).map(|i| (x0 / step).ceil() * step + i as f64 * step).collect()
        };
        for x in xticks {
            let label = if self.x_log2 { bytes_label(x) } else { number_label(x) };
            let xp = px(x);
            let _ = writeln!(
                g,
                "<line x1=\"{xp:.1}\" y1=\"{M_TOP}\" x2=\"{xp:.1}\" y2=\"{:.1}\" stroke=\"#ddd\"/><text x=\"{xp:.1}\" \
                 y=\"{:.1}\" font-size=\"11\" text-anchor=\"middle\">{label}</text>",
                M_TOP + ph,
                M_TOP + ph + 16.0
            );
        }
        let yticks: Vec<f64> = if log_y {
            (y0v as i64..=y1v as i64).map(|e| 10f64.powi(e as i32)).collect()
        } else {
            let step = nice_step(y1v);
            (0..=(y1v / step) as i64).map(|i| i as f64 * step).collect()
        };
        for y in yticks {
            let yp = py(y);
            let _ = writeln!(
                g,
                "<line x1=\"{M_LEFT}\" y1=\"{yp:.1}\" x2=\"{:.1}\" y2=\"{yp:.1}\" stroke=\"#ddd\"/><text x=\"{:.1}\" \
                 y=\"{:.1}\" font-size=\"11\" text-anchor=\"end\">{}</text>",
                M_LEFT + pw,
                M_LEFT - 6.0,
                yp + 4.0,
                number_label(y)
            );
        }
        let _ = writeln!(
            g,
            "<text x=\"{:.1}\" y=\"{:.1}\" font-size=\"12\" text-anchor=\"middle\">{}</text>",
            M_LEFT + pw / 2.0,
            H - 12.0,
            esc(&self.x_label)
        );
        let _ = writeln!(
            g,
            "<text transform=\"translate(18,{:.1}) rotate(-90)\" font-size=\"12\" text-anchor=\"middle\">{}</text>",
            M_TOP + ph / 2.0,
            esc(&self.y_label)
        );
        for (x, label) in &self.marks {
            let xp = px(*x);
            let _ = writeln!(
                g,
                "<line x1=\"{xp:.1}\" y1=\"{M_TOP}\" x2=\"{xp:.1}\" y2=\"{:.1}\" stroke=\"#d62728\" \
                 stroke-dasharray=\"5,4\" stroke-width=\"1.5\"/><text x=\"{:.1}\" y=\"{:.1}\" font-size=\"10\" \
                 fill=\"#d62728\">{}</text>",
                M_TOP + ph,
                xp + 3.0,
                M_TOP + 12.0,
                esc(label)
            );
        }
        for (i, s) in self.series.iter().enumerate() {
            let color = COLORS[i % COLORS.len()];
            let path: Vec<String> = s.points.iter().map(|&(x, y)| format!("{:.1},{:.1}", px(x), py(y))).collect();
            let _ = writeln!(
                g,
                "<polyline points=\"{}\" fill=\"none\" stroke=\"{color}\" stroke-width=\"2\"/>",
                path.join(" ")
            );
            for &(x, y) in &s.points {
                let _ = writeln!(g, "<circle cx=\"{:.1}\" cy=\"{:.1}\" r=\"2.5\" fill=\"{color}\"/>", px(x), py(y));
            }
            let ly = M_TOP + 10.0 + i as f64 * 18.0;
            let lx = M_LEFT + pw + 12.0;
            let _ = writeln!(
                g,
                "<line x1=\"{lx}\" y1=\"{ly}\" x2=\"{}\" y2=\"{ly}\" stroke=\"{color}\" stroke-width=\"3\"/><text \
                 x=\"{}\" y=\"{}\" font-size=\"11\">{}</text>",
                lx + 18.0,
                lx + 24.0,
                ly + 4.0,
                esc(&s.name)
            );
        }
        g.push_str("</g>\n");
        g
    }
}

/// A whole SVG document of charts stacked vertically.
pub fn svg(charts: &[Chart]) -> String {
    let height = H * charts.len().max(1) as f64;
    let mut s = format!(
        "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{W}\" \
         height=\"{height}\" viewBox=\"0 0 {W} {height}\" font-family=\"sans-serif\">\n<rect width=\"100%\" \
         height=\"100%\" fill=\"white\"/>\n"
    );
    for (i, c) in charts.iter().enumerate() {
        s.push_str(&c.render(i as f64 * H));
    }
    s.push_str("</svg>\n");
    s
}

/// The charts of a run: bandwidth and latency percentiles against size.
pub fn charts(doc: &RunDocument) -> Vec<Chart> {
    let mut bw = Chart {
        title: format!("{}: bandwidth", doc.workload),
        x_label: "message size [B]".into(),
        y_label: "average bandwidth [Gb/s]".into(),
        x_log2: true,
        series: Vec::new(),
        marks: Vec::new(),
    };
    let mut lat = Chart {
        title: format!("{}: latency", doc.workload),
        x_label: "message size [B]".into(),
        y_label: "latency [us]".into(),
        x_log2: true,
        series: Vec::new(),
        marks: Vec::new(),
    };
    for step in doc.steps.iter().filter(|s| s.kind == "measure") {
        let series = |metric: &str| -> Vec<(f64, f64)> {
            step.stats.iter().filter_map(|s| s.metrics.get(metric).map(|m| (s.size as f64, m.median))).collect()
        };
        let gbps = series("gbps");
        if !gbps.is_empty() {
            bw.series.push(Series { name: step.name.clone(), points: gbps });
        }
        for (metric, label) in [("p50_us", "p50"), ("p99_us", "p99"), ("p999_us", "p99.9")] {
            let points = series(metric);
            if !points.is_empty() {
                lat.series.push(Series { name: format!("{} {label}", step.name), points });
            }
        }
    }
    [bw, lat].into_iter().filter(|c| !c.series.is_empty()).collect()
}

/// The latency CDF of each histogram in a `--histogram` file (values in us).
pub fn cdf_chart(entries: &[(String, hdrhistogram::Histogram<u64>)]) -> Chart {
    let series = entries
        .iter()
        .map(|(tag, h)| Series {
            name: if tag.is_empty() { "latency".into() } else { tag.clone() },
            points: h
                .iter_quantiles(2)
                .map(|v| (v.value_iterated_to() as f64 / 1e3, v.quantile_iterated_to() * 100.0))
                .collect(),
        })
        .collect();
    Chart {
        title: "latency CDF (round trip)".into(),
        x_label: "round-trip latency [us]".into(),
        y_label: "samples at or below [%]".into(),
        x_log2: false,
        series,
        marks: Vec::new(),
    }
}

/// What to plot: a run or result document, where to write the SVG (default: beside it),
/// and optionally a `--histogram` file for the latency CDF.
#[derive(Debug, Clone)]
pub struct Request {
    pub result: String,
    pub output: Option<String>,
    pub histogram: Option<String>,
}

pub fn command(args: &Request) -> Result<()> {
    let doc = doc::read(&args.result)?;
    let mut charts = charts(&doc);
    if let Some(h) = &args.histogram {
        charts.push(cdf_chart(&crate::report::histogram::read(h)?));
    }
    if charts.is_empty() {
        return Err(Error::Usage(format!(
            "{} has no bandwidth or latency figures to draw (validate steps only?)",
            args.result
        )));
    }
    let target = args.output.clone().unwrap_or_else(|| {
        let base = args.result.strip_suffix(".json").unwrap_or(&args.result);
        format!("{base}.svg")
    });
    super::file::write(&target, svg(&charts).as_bytes(), "the plot")?;
    eprintln!("rdmabench: wrote {target} ({} chart(s))", charts.len());
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn chart(x_log2: bool, points: Vec<(f64, f64)>) -> Chart {
        Chart {
            title: "t <&>".into(),
            x_label: "x".into(),
            y_label: "y".into(),
            x_log2,
            series: vec![Series { name: "a".into(), points }, Series { name: "b".into(), points: vec![(4.0, 1.0)] }],
            marks: vec![(8.0, "change <1>".into())],
        }
    }

    #[test]
    fn svg_is_well_formed_with_a_line_per_series() {
        let sizes: Vec<(f64, f64)> = (1..=23).map(|p| (2f64.powi(p), p as f64 * 1.5)).collect();
        let text = svg(&[chart(true, sizes), chart(false, vec![(1.0, 0.5), (300.0, 99.0)])]);
        let doc = roxmltree::Document::parse(&text).expect("well-formed SVG");
        assert_eq!(doc.root_element().tag_name().name(), "svg");
        assert_eq!(doc.descendants().filter(|n| n.has_tag_name("polyline")).count(), 4);
        assert!(text.contains(">4M<") && text.contains("t &lt;&amp;&gt;"), "size labels and escaping");
    }

    #[test]
    fn cdf_rises_to_100_percent() {
        let mut h = hdrhistogram::Histogram::<u64>::new_with_bounds(1, 3_600_000_000_000, 3).unwrap();
        for v in 1..=1000u64 {
            h.record(10_000 + v * 10).unwrap();
        }
        let c = cdf_chart(&[("size=2".into(), h)]);
        let pts = &c.series[0].points;
        assert!(pts.windows(2).all(|w| w[0].0 <= w[1].0 && w[0].1 <= w[1].1), "monotone");
        assert!((pts.last().unwrap().1 - 100.0).abs() < 1e-9);
        assert!(pts[0].0 >= 10.0 && pts.last().unwrap().0 <= 20.1, "microseconds: {:?}", pts.last());
        roxmltree::Document::parse(&svg(&[c])).unwrap();
    }

    #[test]
    fn latency_spanning_decades_uses_a_log_axis_and_empty_charts_say_so() {
        let text = svg(&[chart(true, vec![(2.0, 1.0), (1024.0, 5000.0)])]);
        assert!(text.contains(">1000<") || text.contains(">10000<"), "decade ticks");
        let empty = Chart { series: Vec::new(), ..chart(true, Vec::new()) };
        assert!(svg(&[empty]).contains("no data"));
    }
}
