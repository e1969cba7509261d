//! A hand-written SVG line plot of collaboration-rate curves (no plotting dependency).
//!
//! Colour encodes the setting (joint blue, single red), the dash pattern encodes T, so the
//! four curves of single/joint x T=10/T=20 share one figure like the paper's Figure 5.

use std::fmt::Write as _;

use super::game::{Curve, Setting};

/// Width of the SVG canvas (the `viewBox` is `0 0 WIDTH HEIGHT`).
pub const WIDTH: f64 = 760.0;
/// Height of the SVG canvas.
pub const HEIGHT: f64 = 460.0;

const LEFT: f64 = 64.0;
const RIGHT: f64 = 190.0;
const TOP: f64 = 44.0;
const BOTTOM: f64 = 56.0;
const DASHES: [&str; 4] = ["", "8 5", "2 4", "12 4 3 4"];

fn escape(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

fn colour(setting: Setting) -> &'static str {
    match setting {
        Setting::Joint => "#1f77b4",
        Setting::Single => "#d62728",
    }
}

/// A "nice" tick step (1, 2 or 5 times a power of ten) giving at most about `max_ticks` ticks.
fn tick_step(span: f64, max_ticks: f64) -> f64 {
    let raw = (span / max_ticks).max(1.0);
    let mag = 10f64.powf(raw.log10().floor());
    [1.0, 2.0, 5.0, 10.0]
        .iter()
        .map(|m| m * mag)
        .find(|s| *s >= raw)
        .unwrap_or(10.0 * mag)
}

/// Renders the curves' collaboration rate against the training iteration as a standalone SVG
/// document. The y axis is fixed to [0, 1]; the x axis spans the longest curve. Every curve
/// becomes exactly one `<polyline>`; an empty curve list gives axes and no lines.
pub fn render_svg(curves: &[Curve], title: &str) -> String {
    let plot_w = WIDTH - LEFT - RIGHT;
    let plot_h = HEIGHT - TOP - BOTTOM;
    let max_len = curves
        .iter()
        .map(|c| c.collab_rate.len())
        .max()
        .unwrap_or(1);
    let x_span = max_len.max(1) as f64;
    let px = |i: f64| LEFT + i / x_span * plot_w;
    let py = |r: f64| TOP + (1.0 - r.clamp(0.0, 1.0)) * plot_h;

    let mut rounds: Vec<usize> = curves.iter().map(|c| c.config.rounds).collect();
    rounds.sort_unstable();
    rounds.dedup();
    let dash_of = |t: usize| {
        let k = rounds.iter().position(|&r| r == t).unwrap_or(0);
        DASHES[k % DASHES.len()]
    };

    let mut s = String::new();
    let _ = writeln!(
        s,
        r#"<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {WIDTH} {HEIGHT}" width="{WIDTH}" height="{HEIGHT}" font-family="sans-serif" font-size="12">"#
    );
    let _ = writeln!(
        s,
        r#"<rect x="0" y="0" width="{WIDTH}" height="{HEIGHT}" fill="white"/>"#
    );
    let _ = writeln!(
        s,
        r#"<text x="{:.1}" y="24" text-anchor="middle" font-size="15">{}</text>"#,
        LEFT + plot_w / 2.0,
        escape(title)
    );

    // Horizontal grid and y ticks.
    for k in 0..=4 {
        let r = k as f64 / 4.0;
        let y = py(r);
        let _ = writeln!(
            s,
            r##"<line x1="{LEFT:.1}" y1="{y:.1}" x2="{:.1}" y2="{y:.1}" stroke="#dddddd"/>"##,
            LEFT + plot_w
        );
        let _ = writeln!(
            s,
            r#"<text x="{:.1}" y="{:.1}" text-anchor="end">{r:.2}</text>"#,
            LEFT - 6.0,
            y + 4.0
        );
    }
    // x ticks.
    let step = tick_step(x_span, 8.0);
    let mut i = 0.0;
    while i <= x_span + 1e-9 {
        let x = px(i);
        let _ = writeln!(
            s,
            r#"<line x1="{x:.1}" y1="{:.1}" x2="{x:.1}" y2="{:.1}" stroke="black"/>"#,
            TOP + plot_h,
            TOP + plot_h + 5.0
        );
        let _ = writeln!(
            s,
            r#"<text x="{x:.1}" y="{:.1}" text-anchor="middle">{i}</text>"#,
            TOP + plot_h + 18.0
        );
        i += step;
    }
    // Axes and labels.
    let _ = writeln!(
        s,
        r#"<line x1="{LEFT:.1}" y1="{TOP:.1}" x2="{LEFT:.1}" y2="{:.1}" stroke="black"/>"#,
        TOP + plot_h
    );
    let _ = writeln!(
        s,
        r#"<line x1="{LEFT:.1}" y1="{:.1}" x2="{:.1}" y2="{:.1}" stroke="black"/>"#,
        TOP + plot_h,
        LEFT + plot_w,
        TOP + plot_h
    );
    let _ = writeln!(
        s,
        r#"<text x="{:.1}" y="{:.1}" text-anchor="middle">training iteration</text>"#,
        LEFT + plot_w / 2.0,
        HEIGHT - 14.0
    );
    let _ = writeln!(
        s,
        r#"<text x="16" y="{:.1}" text-anchor="middle" transform="rotate(-90 16 {:.1})">collaboration rate</text>"#,
        TOP + plot_h / 2.0,
        TOP + plot_h / 2.0
    );

    // Curves.
    for c in curves {
        let mut pts = String::new();
        for (i, r) in c.collab_rate.iter().enumerate() {
            if !pts.is_empty() {
                pts.push(' ');
            }
            let _ = write!(pts, "{:.1},{:.1}", px(i as f64), py(*r));
        }
        let dash = dash_of(c.config.rounds);
        let dash_attr = if dash.is_empty() {
            String::new()
        } else {
            format!(r#" stroke-dasharray="{dash}""#)
        };
        let _ = writeln!(
            s,
            r#"<polyline points="{pts}" fill="none" stroke="{}" stroke-width="2"{dash_attr}/>"#,
            colour(c.setting)
        );
    }

    // Legend.
    let lx = LEFT + plot_w + 16.0;
    for (k, c) in curves.iter().enumerate() {
        let y = TOP + 10.0 + 22.0 * k as f64;
        let dash = dash_of(c.config.rounds);
        let dash_attr = if dash.is_empty() {
            String::new()
        } else {
            format!(r#" stroke-dasharray="{dash}""#)
        };
        let _ = writeln!(
            s,
            r#"<line x1="{lx:.1}" y1="{y:.1}" x2="{:.1}" y2="{y:.1}" stroke="{}" stroke-width="2"{dash_attr}/>"#,
            lx + 30.0,
            colour(c.setting)
        );
        let _ = writeln!(
            s,
            r#"<text x="{:.1}" y="{:.1}">{}</text>"#,
            lx + 36.0,
            y + 4.0,
            escape(&c.label)
        );
    }
    s.push_str("</svg>\n");
    s
}
