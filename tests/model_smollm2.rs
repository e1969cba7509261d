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
