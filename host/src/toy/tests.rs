use super::*;

fn cfg(rounds: usize, r_syn: f64) -> ToyConfig {
    ToyConfig {
        rounds,
        r_syn,
        ..Default::default()
    }
}

#[test]
fn payoffs_match_the_stated_formula() {
    let c = ToyConfig {
        r_syn: 3.0,
        cost: 1.0,
        threshold: 2,
        ..Default::default()
    };
    assert_eq!(play_round(&c, [true, true], [0.0, 1.0]), [2.0, 3.0]);
    assert_eq!(play_round(&c, [true, false], [1.0, 1.0]), [0.0, 1.0]);
    assert_eq!(play_round(&c, [false, false], [0.0, 1.0]), [0.0, 1.0]);
    let c1 = ToyConfig { threshold: 1, ..c };
    assert_eq!(play_round(&c1, [false, true], [0.0, 0.0]), [0.0, 2.0]);
}

#[test]
fn large_r_syn_joint_ends_above_single() {
    let th = thresholds(&ToyConfig::default());
    // Between the joint and the single thresholds (2 and 5 with the defaults).
    let r = 3.0;
    assert!(th.joint_above < r && r < th.single_above, "{th:?}");
    for t in [10, 20] {
        let c = cfg(t, r);
        let single = train(&c, Setting::Single).unwrap();
        let joint = train(&c, Setting::Joint).unwrap();
        let (s, j) = (single.final_rate(), joint.final_rate());
        assert!(j > 0.8, "T={t}: joint ends at {j}");
        assert!(joint.final_mutual_rate() > 0.7, "T={t}: joint mutual rate");
        assert!(j - s > 0.5, "T={t}: joint {j} vs single {s}");
        assert!(s < 0.2, "T={t}: single ends at {s}");
        // Both start uniform.
        assert!((single.collab_rate[0] - 0.5).abs() < 1e-9);
        assert!((joint.collab_rate[0] - 0.5).abs() < 1e-9);
    }
}

#[test]
fn below_threshold_neither_collaborates() {
    let th = thresholds(&ToyConfig::default());
    // Below c (collaboration dominated) and between c and 2c (stag hunt, independence
    // risk-dominant from the uniform start).
    for r in [0.0, 0.9 * th.dominated_below, 0.9 * th.joint_above] {
        for t in [10, 20] {
            let c = cfg(t, r);
            for setting in [Setting::Single, Setting::Joint] {
                let curve = train(&c, setting).unwrap();
                let f = curve.final_rate();
                assert!(f < 0.2, "R_syn={r} T={t} {setting:?}: ends at {f}");
            }
        }
    }
}

#[test]
fn single_learner_collaborates_above_its_own_threshold() {
    // rho = 0.5: the single learner's threshold c / rho = 2, so R_syn = 4 pays off alone.
    let c = ToyConfig {
        r_syn: 4.0,
        partner_rate: 0.5,
        ..Default::default()
    };
    assert!(thresholds(&c).single_above < c.r_syn);
    assert!(train(&c, Setting::Single).unwrap().final_rate() > 0.8);
    // C = 1: the synergy needs nobody else, so even a rarely-collaborating partner is fine.
    let c1 = ToyConfig {
        r_syn: 2.0,
        threshold: 1,
        partner_rate: 0.0,
        ..Default::default()
    };
    assert!(train(&c1, Setting::Single).unwrap().final_rate() > 0.8);
}

#[test]
fn same_seed_same_curves_other_seed_differs() {
    let c = ToyConfig {
        iterations: 40,
        ..cfg(10, 3.0)
    };
    for setting in [Setting::Single, Setting::Joint] {
        let a = train(&c, setting).unwrap();
        let b = train(&c, setting).unwrap();
        assert_eq!(a, b);
        let d = train(
            &ToyConfig {
                seed: 7,
                ..c.clone()
            },
            setting,
        )
        .unwrap();
        assert_ne!(a.collab_rate, d.collab_rate);
    }
}

#[test]
fn invalid_configs_are_rejected() {
    for bad in [
        ToyConfig {
            rounds: 0,
            ..Default::default()
        },
        ToyConfig {
            threshold: 3,
            ..Default::default()
        },
        ToyConfig {
            partner_rate: 1.5,
            ..Default::default()
        },
        ToyConfig {
            lr: 0.0,
            ..Default::default()
        },
    ] {
        assert!(train(&bad, Setting::Single).is_err(), "{bad:?}");
    }
}

/// Minimal XML check: every `<tag ...>` is closed in order, the document is one `<svg>`
/// element, and returns the (name, attribute text) of every start tag.
fn parse_tags(svg: &str) -> Vec<(String, String)> {
    let mut stack: Vec<String> = Vec::new();
    let mut tags = Vec::new();
    let mut rest = svg.trim();
    assert!(rest.starts_with("<svg"), "document must start with <svg");
    let mut roots = 0;
    while let Some(open) = rest.find('<') {
        let close = rest[open..].find('>').expect("unterminated tag") + open;
        let inner = &rest[open + 1..close];
        assert!(!inner.contains('<'), "'<' inside a tag: {inner}");
        if let Some(name) = inner.strip_prefix('/') {
            assert_eq!(
                stack.pop().as_deref(),
                Some(name.trim()),
                "mismatched </{name}>"
            );
        } else {
            let self_closing = inner.ends_with('/');
            let body = inner.trim_end_matches('/');
            let name = body
                .split_whitespace()
                .next()
                .expect("empty tag")
                .to_string();
            let attrs = body[name.len()..].to_string();
            assert_eq!(
                attrs.matches('"').count() % 2,
                0,
                "unbalanced quotes: {inner}"
            );
            if stack.is_empty() {
                roots += 1;
            }
            if !self_closing {
                stack.push(name.clone());
            }
            tags.push((name, attrs));
        }
        // Text between tags must not hold stray markup characters.
        let next = rest[close + 1..]
            .find('<')
            .map_or(rest.len(), |n| n + close + 1);
        assert!(!rest[close + 1..next].contains('>'), "stray '>'");
        rest = &rest[close + 1..];
    }
    assert!(stack.is_empty(), "unclosed tags: {stack:?}");
    assert_eq!(roots, 1, "one root element");
    tags
}

fn attr(attrs: &str, key: &str) -> Option<String> {
    let pat = format!(" {key}=\"");
    let start = attrs.find(&pat)? + pat.len();
    let end = attrs[start..].find('"')? + start;
    Some(attrs[start..end].to_string())
}

#[test]
fn svg_is_well_formed_with_one_polyline_per_curve() {
    let base = ToyConfig {
        iterations: 30,
        ..Default::default()
    };
    let mut curves = run_grid(&base, &[10, 20]).unwrap();
    curves[0].label = "a <label> & \"quotes\"".into();
    let svg = render_svg(&curves, "Title with <markup> & more");
    let tags = parse_tags(&svg);
    assert_eq!(tags[0].0, "svg");
    let view: Vec<f64> = attr(&tags[0].1, "viewBox")
        .unwrap()
        .split_whitespace()
        .map(|v| v.parse().unwrap())
        .collect();
    assert_eq!(view, vec![0.0, 0.0, WIDTH, HEIGHT]);
    let polylines: Vec<_> = tags.iter().filter(|(n, _)| n == "polyline").collect();
    assert_eq!(polylines.len(), curves.len());
    for ((_, attrs), curve) in polylines.iter().zip(&curves) {
        let pts = attr(attrs, "points").unwrap();
        let pts: Vec<(f64, f64)> = pts
            .split_whitespace()
            .map(|p| {
                let (x, y) = p.split_once(',').unwrap();
                (x.parse().unwrap(), y.parse().unwrap())
            })
            .collect();
        assert_eq!(pts.len(), curve.collab_rate.len());
        for (x, y) in &pts {
            assert!(
                (0.0..=WIDTH).contains(x) && (0.0..=HEIGHT).contains(y),
                "{x},{y}"
            );
        }
        // x increases along the curve; a higher rate is drawn higher (smaller y).
        assert!(pts.windows(2).all(|w| w[1].0 > w[0].0));
    }
    // Legend: every label appears (escaped).
    assert!(svg.contains("a &lt;label&gt; &amp; &quot;quotes&quot;"));
    assert!(svg.contains("joint, T=20"));
    // Empty input still yields a valid document without curves.
    let empty = render_svg(&[], "empty");
    assert!(parse_tags(&empty).iter().all(|(n, _)| n != "polyline"));
}

#[test]
fn table_and_json_cover_every_curve() {
    let base = ToyConfig {
        iterations: 20,
        ..Default::default()
    };
    let curves = run_grid(&base, &[10, 20]).unwrap();
    let labels: Vec<_> = curves.iter().map(|c| c.label.as_str()).collect();
    assert_eq!(
        labels,
        ["single, T=10", "joint, T=10", "single, T=20", "joint, T=20"]
    );
    let t = table(&curves);
    for l in &labels {
        assert!(t.contains(l), "{t}");
    }
    assert!(t.contains("analytic thresholds"));
    let j = report_json(&curves);
    assert_eq!(j["curves"].as_array().unwrap().len(), 4);
    assert_eq!(j["curves"][1]["setting"], "joint");
    assert_eq!(j["thresholds"]["joint_above"], 2.0);
    let dir = std::env::temp_dir().join(format!("maporl-toy-test-{}", std::process::id()));
    let (svg, json) = write_outputs(&dir, &curves).unwrap();
    assert!(std::fs::read_to_string(svg).unwrap().starts_with("<svg"));
    let back: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(json).unwrap()).unwrap();
    assert_eq!(back["curves"][3]["label"], "joint, T=20");
    assert_eq!(back["assumptions"], ASSUMPTIONS);
    std::fs::remove_dir_all(&dir).unwrap();
}
