//! Memory: three agents over one shared SmolLM2 base cost at most 1.25x one agent (RSS).
//! One test in its own binary, so no other test's allocations are counted.

mod support;

use candle_core::{DType, Device};
use maporl::model::Pass;
use maporl::model::{load, score, Agent, Lora, LoraConfig, ValueHead};
use std::sync::Arc;

fn status_kb(field: &str) -> u64 {
    let s = std::fs::read_to_string("/proc/self/status").unwrap();
    s.lines()
        .find(|l| l.starts_with(field))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("no {field} in /proc/self/status"))
}

fn agent(base: &Arc<maporl::model::Base>, seed: u64) -> Agent {
    let targets = [
        "q_proj",
        "k_proj",
        "v_proj",
        "o_proj",
        "gate_proj",
        "up_proj",
        "down_proj",
    ];
    let cfg = LoraConfig {
        r: 8,
        alpha: 16.0,
        target_modules: targets.iter().map(|s| s.to_string()).collect(),
    };
    let mut a = Agent::new(base.clone());
    a.lora = Some(Lora::new(base, cfg, seed).unwrap());
    a.value_head =
        Some(ValueHead::new(base.config().hidden_size, DType::F32, &Device::Cpu, seed).unwrap());
    a
}

fn work(a: &Agent) -> f32 {
    let pairs = vec![(vec![1u32, 2, 3, 4, 5, 6, 7, 8], vec![9u32; 16]); 2];
    let s = score(a, &pairs, Pass::Training, 8).unwrap();
    s.logprobs.sum_all().unwrap().to_scalar::<f32>().unwrap()
}

#[test]
fn three_agents_on_one_base_cost_at_most_1_25x_one() {
    let base = Arc::new(
        load(&support::smollm2(), DType::F32, &Device::Cpu)
            .unwrap()
            .base,
    );
    let a1 = agent(&base, 1);
    let lp1 = work(&a1);
    let one = status_kb("VmRSS:");
    let hwm_one = status_kb("VmHWM:");
    let a2 = agent(&base, 2);
    let a3 = agent(&base, 3);
    let lp2 = work(&a2);
    let lp3 = work(&a3);
    let three = status_kb("VmRSS:");
    let hwm_three = status_kb("VmHWM:");
    // Fresh adapters (B = 0) leave the base's log-probs unchanged: all three agree.
    assert!((lp1 - lp2).abs() < 1e-3 && (lp1 - lp3).abs() < 1e-3);
    let ratio = three as f64 / one as f64;
    println!(
        "VmRSS one agent {} MB, three agents {} MB, ratio {ratio:.3}; VmHWM {} -> {} MB",
        one / 1024,
        three / 1024,
        hwm_one / 1024,
        hwm_three / 1024
    );
    assert!(
        ratio <= 1.25,
        "three agents use {ratio:.3}x the memory of one"
    );
    drop((a1, a2, a3));
}
