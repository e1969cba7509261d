//! Inline SVG charts for the report: line charts (one `<polyline>` per series, broken where
//! a value is missing) and grouped bar charts. No plotting dependency.
//!
//! Every chart's `<svg>` carries its data-to-pixel mapping as attributes (`data-x0`,
//! `data-x1`, `data-y0`, `data-y1` for the data range; `data-left`, `data-right`, `data-top`,
//! `data-bottom` for the plot area), so a reader (or a test) can map points back to values:
//! `x = left + (v - x0) / (x1 - x0) * (right - left)`, `y = bottom - (v - y0) / (y1 - y0) *
//! (bottom - top)`.

use std::fmt::Write as _;

const WIDTH: f64 = 590.0;
const HEIGHT: f64 = 280.0;
const LEFT: f64 = 64.0;
const RIGHT: f64 = WIDTH - 150.0;
const TOP: f64 = 34.0;
const BOTTOM: f64 = HEIGHT - 42.0;
/// Series with at most this many points get a marker (with a tooltip) per point.
const MARKERS_UP_TO: usize = 60;
const PALETTE: [&str; 10] = [
    "#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f",
    "#bcbd22", "#17becf",
];

/// One line: `(x, value)` points in x order; a `None` value is a gap.
pub struct Series {
    pub name: String,
    pub points: Vec<(f64, Option<f64>)>,
}

/// A line chart's labels and its fixed y range, if any (else the data's, padded).
pub struct Chart<'a> {
    /// Identifies the chart in the page (`data-chart`).
    pub id: &'a str,
    pub title: &'a str,
    pub x_label: &'a str,
    pub y_label: &'a str,
    pub y_range: Option<(f64, f64)>,
}

/// A number for an axis, a label or a tooltip: short, no trailing zeros.
pub fn num(v: f64) -> String {
    if v == 0.0 {
        return "0".into();
    }
    let a = v.abs();
    if !(1e-3..1e5).contains(&a) {
        return format!("{v:.2e}");
    }
    let s = format!("{v:.4}");
    let s = s.trim_end_matches('0').trim_end_matches('.');
    s.to_string()
}

fn finite_range(values: impl Iterator<Item = f64>) -> Option<(f64, f64)> {
    values
        .filter(|v| v.is_finite())
        .fold(None, |acc, v| match acc {
            None => Some((v, v)),
            Some((lo, hi)) => Some((lo.min(v), hi.max(v))),
        })
}

/// A y range around the data that starts and ends on a "nice" tick (a flat series gets
/// +-1 around it, or +-|v|/2).
fn nice_range((lo, hi): (f64, f64)) -> (f64, f64) {
    let (lo, hi) = if hi > lo {
        (lo, hi)
    } else {
        let pad = if lo == 0.0 { 1.0 } else { lo.abs() / 2.0 };
        (lo - pad, hi + pad)
    };
    let step = nice_step(hi - lo, 4.0);
    ((lo / step).floor() * step, (hi / step).ceil() * step)
}

/// Where the data range lands in the plot area.
struct Frame {
    x0: f64,
    x1: f64,
    y0: f64,
    y1: f64,
}

impl Frame {
    fn px(&self, x: f64) -> f64 {
        LEFT + (x - self.x0) / (self.x1 - self.x0) * (RIGHT - LEFT)
    }
    fn py(&self, y: f64) -> f64 {
        BOTTOM - (y - self.y0) / (self.y1 - self.y0) * (BOTTOM - TOP)
    }

    /// The `<svg>` opening tag, background, title, grid, ticks and axis labels.
    fn open(&self, s: &mut String, id: &str, title: &str, x_label: &str, y_label: &str) {
        let _ = writeln!(
            s,
            r#"<svg class="chart" data-chart="{}" xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {WIDTH} {HEIGHT}" width="{WIDTH}" height="{HEIGHT}" data-x0="{}" data-x1="{}" data-y0="{}" data-y1="{}" data-left="{LEFT}" data-right="{RIGHT}" data-top="{TOP}" data-bottom="{BOTTOM}" role="img" aria-label="{}">"#,
            escape(id),
            self.x0,
            self.x1,
            self.y0,
            self.y1,
            escape(title)
        );
        let _ = writeln!(
            s,
            r#"<text x="{:.1}" y="20" text-anchor="middle" class="title">{}</text>"#,
            (LEFT + RIGHT) / 2.0,
            escape(title)
        );
        let step = nice_step(self.y1 - self.y0, 5.0);
        let first = (self.y0 / step - 1e-9).ceil() * step;
        for k in 0.. {
            let v = first + step * k as f64;
            if v > self.y1 + step * 1e-9 {
                break;
            }
            let y = self.py(v);
            let _ = writeln!(
                s,
                r#"<line class="grid" x1="{LEFT}" y1="{y:.2}" x2="{RIGHT}" y2="{y:.2}"/><text x="{:.1}" y="{:.2}" text-anchor="end">{}</text>"#,
                LEFT - 5.0,
                y + 4.0,
                num(v)
            );
        }
        let _ = writeln!(
            s,
            r#"<line class="axis" x1="{LEFT}" y1="{TOP}" x2="{LEFT}" y2="{BOTTOM}"/><line class="axis" x1="{LEFT}" y1="{BOTTOM}" x2="{RIGHT}" y2="{BOTTOM}"/>"#
        );
        let _ = writeln!(
            s,
            r#"<text x="{:.1}" y="{:.1}" text-anchor="middle">{}</text>"#,
            (LEFT + RIGHT) / 2.0,
            HEIGHT - 8.0,
            escape(x_label)
        );
        let mid = (TOP + BOTTOM) / 2.0;
        let _ = writeln!(
            s,
            r#"<text x="14" y="{mid:.1}" text-anchor="middle" transform="rotate(-90 14 {mid:.1})">{}</text>"#,
            escape(y_label)
        );
    }

    fn x_ticks(&self, s: &mut String, integer: bool) {
        let span = self.x1 - self.x0;
        let step = if integer {
            nice_step(span, 8.0).max(1.0)
        } else {
            nice_step(span, 8.0)
        };
        let first = (self.x0 / step - 1e-9).ceil() * step;
        for k in 0.. {
            let v = first + step * k as f64;
            if v > self.x1 + step * 1e-9 {
                break;
            }
            let x = self.px(v);
            let _ = writeln!(
                s,
                r#"<line class="axis" x1="{x:.2}" y1="{BOTTOM}" x2="{x:.2}" y2="{:.1}"/><text x="{x:.2}" y="{:.1}" text-anchor="middle">{}</text>"#,
                BOTTOM + 4.0,
                BOTTOM + 16.0,
                num(v)
            );
        }
    }
}

/// A "nice" step (1, 2 or 5 times a power of ten) giving at most about `ticks` ticks.
fn nice_step(span: f64, ticks: f64) -> f64 {
    let raw = (span / ticks).max(f64::MIN_POSITIVE);
    let mag = 10f64.powf(raw.log10().floor());
    [1.0, 2.0, 5.0, 10.0]
        .iter()
        .map(|m| m * mag)
        .find(|s| *s >= raw)
        .unwrap_or(10.0 * mag)
}

/// One legend line a series: (name, colour).
fn legend(s: &mut String, names: &[(&str, &str)]) {
    for (k, (name, colour)) in names.iter().enumerate() {
        let y = TOP + 6.0 + 18.0 * k as f64;
        let _ = writeln!(
            s,
            r#"<line x1="{:.1}" y1="{y:.1}" x2="{:.1}" y2="{y:.1}" stroke="{}" stroke-width="3"/><text x="{:.1}" y="{:.1}">{}</text>"#,
            RIGHT + 12.0,
            RIGHT + 32.0,
            colour,
            RIGHT + 37.0,
            y + 4.0,
            escape(name)
        );
    }
}

/// A line chart of `series` against a numeric x (steps, turns). Each run of present values
/// is one `<polyline class="series" data-series=NAME>`; a lone point between gaps is a
/// marker only. Non-finite values are gaps too.
pub fn line_chart(chart: &Chart, series: &[Series]) -> String {
    let xs = || series.iter().flat_map(|s| s.points.iter().map(|p| p.0));
    let (x0, x1) = match finite_range(xs()) {
        Some((lo, hi)) if hi > lo => (lo, hi),
        Some((lo, _)) => (lo - 1.0, lo + 1.0),
        None => (0.0, 1.0),
    };
    let ys = || {
        series
            .iter()
            .flat_map(|s| s.points.iter().filter_map(|p| p.1))
    };
    let (y0, y1) = chart
        .y_range
        .or_else(|| finite_range(ys()).map(nice_range))
        .unwrap_or((0.0, 1.0));
    let frame = Frame { x0, x1, y0, y1 };
    let mut s = String::new();
    frame.open(&mut s, chart.id, chart.title, chart.x_label, chart.y_label);
    let integer = xs().all(|x| x.fract() == 0.0);
    frame.x_ticks(&mut s, integer);
    for (k, ser) in series.iter().enumerate() {
        let colour = PALETTE[k % PALETTE.len()];
        let name = escape(&ser.name);
        let segments = ser
            .points
            .split(|p| !p.1.is_some_and(f64::is_finite))
            .filter(|seg| !seg.is_empty());
        for seg in segments {
            if seg.len() < 2 {
                continue;
            }
            let pts: Vec<String> = seg
                .iter()
                .map(|&(x, y)| format!("{:.2},{:.2}", frame.px(x), frame.py(y.unwrap_or(0.0))))
                .collect();
            let _ = writeln!(
                s,
                r#"<polyline class="series" data-series="{name}" points="{}" fill="none" stroke="{colour}" stroke-width="2"><title>{name}</title></polyline>"#,
                pts.join(" ")
            );
        }
        let present: Vec<(f64, f64)> = ser
            .points
            .iter()
            .filter_map(|&(x, y)| y.filter(|v| v.is_finite()).map(|y| (x, y)))
            .collect();
        let lonely = |i: usize| {
            let gap = |j: Option<usize>| {
                j.and_then(|j| ser.points.get(j))
                    .is_none_or(|p| !p.1.is_some_and(f64::is_finite))
            };
            gap(i.checked_sub(1)) && gap(Some(i + 1))
        };
        for (i, &(x, y)) in ser.points.iter().enumerate() {
            let Some(y) = y.filter(|v| v.is_finite()) else {
                continue;
            };
            if present.len() <= MARKERS_UP_TO || lonely(i) {
                let _ = writeln!(
                    s,
                    r#"<circle class="point" data-series="{name}" cx="{:.2}" cy="{:.2}" r="3" fill="{colour}"><title>{name}: {} at {}</title></circle>"#,
                    frame.px(x),
                    frame.py(y),
                    num(y),
                    num(x)
                );
            }
        }
    }
    let names: Vec<(&str, &str)> = series
        .iter()
        .enumerate()
        .map(|(k, s)| (s.name.as_str(), PALETTE[k % PALETTE.len()]))
        .collect();
    legend(&mut s, &names);
    s.push_str("</svg>\n");
    s
}

/// A grouped bar chart: one group per label, one bar per series in each group, bars from 0.
/// Each bar is `<rect class="bar" data-series=NAME data-group=LABEL data-value=V>`.
/// Bars grouped by `groups`, one bar a group for each series: (name, one value a group,
/// colour).
pub fn bar_chart(chart: &Chart, groups: &[String], series: &[(String, Vec<f64>, &str)]) -> String {
    let hi = series
        .iter()
        .flat_map(|s| s.1.iter().copied())
        .filter(|v| v.is_finite())
        .fold(0.0f64, f64::max);
    let (y0, y1) = chart
        .y_range
        .unwrap_or_else(|| nice_range((0.0, if hi > 0.0 { hi * 1.05 } else { 1.0 })));
    // x in group units: group g spans [g, g + 1).
    let frame = Frame {
        x0: 0.0,
        x1: groups.len().max(1) as f64,
        y0,
        y1,
    };
    let mut s = String::new();
    frame.open(&mut s, chart.id, chart.title, chart.x_label, chart.y_label);
    let bars = series.len().max(1) as f64;
    let width = (frame.px(1.0) - frame.px(0.0)) * 0.8 / bars;
    for (g, label) in groups.iter().enumerate() {
        let centre = frame.px(g as f64 + 0.5);
        let _ = writeln!(
            s,
            r#"<text x="{centre:.2}" y="{:.1}" text-anchor="middle">{}</text>"#,
            BOTTOM + 16.0,
            escape(label)
        );
        for (k, (name, values, colour)) in series.iter().enumerate() {
            let Some(&v) = values.get(g).filter(|v| v.is_finite()) else {
                continue;
            };
            let x = centre - width * bars / 2.0 + width * k as f64;
            let (top, base) = (frame.py(v.max(y0)), frame.py(y0));
            let _ = writeln!(
                s,
                r#"<rect class="bar" data-series="{}" data-group="{}" data-value="{v}" x="{x:.2}" y="{top:.2}" width="{:.2}" height="{:.2}" fill="{}"><title>{}, {}: {}</title></rect><text x="{:.2}" y="{:.2}" text-anchor="middle" class="small">{}</text>"#,
                escape(name),
                escape(label),
                width - 2.0,
                base - top,
                colour,
                escape(name),
                escape(label),
                num(v),
                x + (width - 2.0) / 2.0,
                top - 3.0,
                num(v)
            );
        }
    }
    let names: Vec<(&str, &str)> = series.iter().map(|s| (s.0.as_str(), s.2)).collect();
    legend(&mut s, &names);
    s.push_str("</svg>\n");
    s
}

/// Escapes text for HTML element content and quoted attribute values.
pub fn escape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c => out.push(c),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gaps_split_lines_and_values_map_to_the_frame() {
        let svg = line_chart(
            &Chart {
                id: "c",
                title: "t",
                x_label: "x",
                y_label: "y",
                y_range: Some((0.0, 1.0)),
            },
            &[Series {
                name: "a<b".into(),
                points: vec![
                    (1.0, Some(0.0)),
                    (2.0, Some(1.0)),
                    (3.0, None),
                    (4.0, Some(0.5)),
                    (5.0, Some(f64::NAN)),
                ],
            }],
        );
        assert_eq!(svg.matches("<polyline").count(), 1, "{svg}");
        let first = format!(
            r#"points="{LEFT:.2},{BOTTOM:.2} {:.2},{TOP:.2}""#,
            LEFT + 0.25 * (RIGHT - LEFT)
        );
        assert!(svg.contains(&first), "{svg}");
        // The lone point at x = 4 is a marker; NaN draws nothing.
        assert_eq!(svg.matches("<circle").count(), 3, "{svg}");
        assert!(svg.contains("a&lt;b") && !svg.contains("a<b"), "{svg}");
    }

    #[test]
    fn numbers_are_short() {
        assert_eq!(num(0.5), "0.5");
        assert_eq!(num(3.0), "3");
        assert_eq!(num(0.12345), "0.1235");
        assert_eq!(num(1e-6), "1.00e-6");
        assert_eq!(num(0.0), "0");
    }
}
