//! SmolLM2-135M-Instruct from its GGUF (fetch it with scripts/fetch-smollm2.sh): config,
//! tokenizer and chat template from the metadata, and a greedy answer.

mod support;

use candle_core::{DType, Device};
use maporl::model::Pass;
use maporl::model::{generate, load, Agent, ChatMessage, GenerateOptions, Sampler, SamplingParams};
use std::sync::Arc;

#[test]
fn smollm2_gguf_answers_the_capital_of_france() {
    let loaded = load(&support::smollm2(), DType::F32, &Device::Cpu).unwrap();
    let cfg = loaded.base.config().clone();
    assert_eq!(
        (
            cfg.num_hidden_layers,
            cfg.hidden_size,
            cfg.num_attention_heads,
            cfg.num_key_value_heads,
            cfg.vocab_size
        ),
        (30, 576, 9, 3, 49152)
    );
    assert!(cfg.tie_word_embeddings);

    let tok = loaded
        .tokenizer
        .as_ref()
        .expect("tokenizer from GGUF metadata");
    // Special tokens are single ids; digits are split one by one; text round-trips.
    let enc = tok
        .encode("<|im_start|>user\nWhat is 12345?<|im_end|>", false)
        .unwrap();
    assert_eq!(enc.get_ids()[0], tok.token_to_id("<|im_start|>").unwrap());
    assert_eq!(
        *enc.get_ids().last().unwrap(),
        tok.token_to_id("<|im_end|>").unwrap()
    );
    let digits = tok.encode("12345", false).unwrap();
    assert_eq!(digits.get_ids().len(), 5);
    let text = "Héllo, wörld!  Tabs\tand\nnewlines 2024.";
    let ids = tok.encode(text, false).unwrap().get_ids().to_vec();
    assert_eq!(tok.decode(&ids, false).unwrap(), text);

    let tmpl = loaded
        .chat_template
        .as_ref()
        .expect("chat template from GGUF metadata");
    let prompt = tmpl
        .render(
            &[ChatMessage::new("user", "What is the capital of France?")],
            true,
        )
        .unwrap();
    println!("{prompt:?}");
    assert!(
        prompt.contains("<|im_start|>user\nWhat is the capital of France?<|im_end|>\n"),
        "{prompt:?}"
    );
    assert!(prompt.ends_with("<|im_start|>assistant\n"), "{prompt:?}");
    let no_gen = tmpl
        .render(
            &[ChatMessage::new("user", "What is the capital of France?")],
            false,
        )
        .unwrap();
    assert!(!no_gen.ends_with("<|im_start|>assistant\n"));

    let ids = tok
        .encode(prompt.as_str(), false)
        .unwrap()
        .get_ids()
        .to_vec();
    let im_end = tok.token_to_id("<|im_end|>").unwrap();
    let mut stops = loaded.eos_token_ids.clone();
    stops.push(im_end);
    let agent = Agent::new(Arc::new(loaded.base));
    let opts = GenerateOptions {
        max_new_tokens: 24,
        stop_tokens: stops,
        pad_token: 0,
    };
    let out = generate(
        &agent,
        &[ids],
        &mut Sampler::new(SamplingParams::greedy(), 0),
        &opts,
    )
    .unwrap();
    let answer = tok.decode(&out[0].tokens, true).unwrap();
    println!("answer: {answer:?}");
    assert!(answer.contains("Paris"), "{answer:?}");
}

#[test]
fn smollm2_logits_follow_candle_quantized_llama_on_the_same_gguf() {
    use candle_core::{IndexOp, Tensor};
    let path = support::smollm2();
    let loaded = load(&path, DType::F32, &Device::Cpu).unwrap();
    let tok = loaded.tokenizer.as_ref().unwrap();
    let ids = tok
        .encode(
            "<|im_start|>user\nName three colours.<|im_end|>\n<|im_start|>assistant\n",
            false,
        )
        .unwrap()
        .get_ids()
        .to_vec();
    let x = Tensor::new(ids.as_slice(), &Device::Cpu)
        .unwrap()
        .unsqueeze(0)
        .unwrap();
    let h = loaded
        .base
        .forward(&x, &[0], None, None, Pass::Inference)
        .unwrap();
    let ours = loaded
        .base
        .logits(&h.i((.., ids.len() - 1, ..)).unwrap())
        .unwrap();

    // candle's llama.cpp-layout model keeps the weights quantized (and the permuted Q/K with an
    // interleaved rope), so it agrees only up to quantization noise of the activations; a
    // mistake in undoing the permutation shows as differences of ~20.
    let mut f = std::fs::File::open(&path).unwrap();
    let content = candle_core::quantized::gguf_file::Content::read(&mut f).unwrap();
    let mut q = candle_transformers::models::quantized_llama::ModelWeights::from_gguf(
        content,
        &mut f,
        &Device::Cpu,
    )
    .unwrap();
    let theirs = q.forward(&x, 0).unwrap();
    let abs = (ours.clone() - &theirs).unwrap().abs().unwrap();
    let diff = abs.max_all().unwrap().to_scalar::<f32>().unwrap();
    let mean = abs.mean_all().unwrap().to_scalar::<f32>().unwrap();
    let spread = ours.max_all().unwrap().to_scalar::<f32>().unwrap()
        - ours.min_all().unwrap().to_scalar::<f32>().unwrap();
    println!("|logit diff| vs quantized_llama: max {diff}, mean {mean} (logit range {spread})");
    assert!(
        diff < 3.0 && mean < 0.5,
        "logit diff: max {diff}, mean {mean}"
    );
    let am = |t: &Tensor| {
        t.argmax(candle_core::D::Minus1)
            .unwrap()
            .to_vec1::<u32>()
            .unwrap()
    };
    assert_eq!(am(&ours), am(&theirs));
}

/// Activation checkpointing on the real model, every projection adapted, with and without
/// LoRA dropout: the recomputed layers give the plain backward's gradients, bit for bit.
#[test]
fn smollm2_checkpointed_gradients_are_the_plain_ones() {
    use maporl::model::{score, score_checkpointed, Lora, LoraConfig};
    let loaded = load(&support::smollm2(), DType::F32, &Device::Cpu).unwrap();
    // A prompt and a response over one logits chunk, and a shorter pair (left padding).
    let ids = |n: u32, from: u32| (0..n).map(|i| from + (i * 37) % 5000).collect::<Vec<u32>>();
    let pairs = vec![(ids(150, 1), ids(80, 7)), (ids(60, 11), ids(30, 13))];
    for dropout in [0.0, 0.05] {
        let mut agent = Agent::new(Arc::new(loaded.base.clone()));
        // Every projection of a llama layer.
        let targets = ["q", "k", "v", "o", "gate", "up", "down"];
        let cfg = LoraConfig {
            r: 4,
            alpha: 8.0,
            target_modules: targets.iter().map(|t| format!("{t}_proj")).collect(),
        };
        let lora = Lora::new(&agent.base, cfg, 1).unwrap();
        // B away from 0, as after a step: the adapters (and their dropout) change the forward.
        for (i, (_, v)) in lora.named_vars().into_iter().enumerate() {
            let vals: Vec<f32> = (0..v.elem_count())
                .map(|j| 0.02 * ((i * 7919 + j * 104729) % 201) as f32 / 100.0 - 0.02)
                .collect();
            v.set(&candle_core::Tensor::from_vec(vals, v.dims(), &Device::Cpu).unwrap())
                .unwrap();
        }
        agent.lora = Some(lora);
        let restart = |agent: &mut Agent| {
            agent
                .lora
                .as_mut()
                .unwrap()
                .set_dropout(dropout, 5)
                .unwrap();
        };
        let loss = |s: &maporl::model::Scored| (&s.logprobs * &s.mask).unwrap().sum_all().unwrap();
        restart(&mut agent);
        let vars = agent.trainable_vars();
        let plain = score(&agent, &pairs, Pass::Training, 64).unwrap();
        let want = loss(&plain).backward().unwrap();
        restart(&mut agent);
        let (kept, checkpoint) = score_checkpointed(&agent, &pairs, 64, 1.0).unwrap();
        let got = checkpoint
            .backward(loss(&kept).backward().unwrap(), &vars)
            .unwrap();
        for (n, v) in agent.named_trainable_vars() {
            let bits = |g: &candle_core::backprop::GradStore| {
                let t = g
                    .get(v.as_tensor())
                    .unwrap_or_else(|| panic!("no gradient for {n}"));
                t.flatten_all().unwrap().to_vec1::<f32>().unwrap()
            };
            assert!(bits(&want) == bits(&got), "dropout {dropout}: {n}");
        }
    }
}
