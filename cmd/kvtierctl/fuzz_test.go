package main

import (
	"encoding/json"
	"testing"
)

// FuzzPlanHFConfig: kvtierctl plan reads a model's config.json, which can
// hold anything. Whatever it holds, parsing and planning return a plan or
// an error, never a panic, and a plan's figures are positive and
// consistent: per-token bytes × tokens per block = block bytes, blocks of
// a request × block bytes = request bytes, on every tier split. Sliding-
// window layers are at most the layers, over a positive window; in window
// mode the block groups' layers and block bytes add up to the model's,
// their blocks are at most the request's, and a request is no larger than
// in full mode. Every tier holds no more than it has room for, and what the
// tiers hold plus what none does is the working set.
func FuzzPlanHFConfig(f *testing.F) {
	for _, m := range modelPresets {
		b, err := json.Marshal(map[string]int{"num_hidden_layers": m.Layers, "num_key_value_heads": m.KVHeads,
			"head_dim": m.HeadDim, "kv_lora_rank": m.KVLoraRank, "qk_rope_head_dim": m.QKRopeHeadDim, "num_attention_heads": 32})
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b, 1, 16)
	}
	f.Add([]byte(`{"num_hidden_layers":1,"num_key_value_heads":1,"head_dim":4611686018427387904}`), 1, 16)
	f.Add([]byte(`{"num_hidden_layers":1,"kv_lora_rank":9223372036854775807,"qk_rope_head_dim":1}`), 1, 16)
	f.Add([]byte(`{"text_config":{"num_hidden_layers":2,"hidden_size":4096,"num_attention_heads":32}}`), 2, 256)
	for _, c := range []string{gemma2Config, gemma3Config, gptOSSConfig, qwen2Config, mistral01Config} {
		f.Add([]byte(c), 1, 16)
	}
	f.Add([]byte(gemma3Config), 1, 5)      // the window's blocks not whole
	f.Add([]byte(mistral01Config), 16, 64) // tp beyond the KV heads
	f.Add([]byte(`{"model_type":"gemma3_text","num_hidden_layers":3,"num_key_value_heads":1,"head_dim":1,"sliding_window":9223372036854775807,"sliding_window_pattern":9223372036854775807}`), 1, 1)
	f.Add([]byte(`{"model_type":"qwen2","num_hidden_layers":4,"num_key_value_heads":1,"head_dim":8,"sliding_window":1,"use_sliding_window":true,"max_window_layers":-9223372036854775808}`), 1, 16)
	f.Add([]byte(`{"num_hidden_layers":2,"num_key_value_heads":1,"head_dim":8,"sliding_window":1,"layer_types":["sliding_attention","sliding_attention","full_attention"]}`), 1, 16)
	f.Add([]byte(`{"model_type":"gemma2","num_hidden_layers":1,"num_key_value_heads":1,"head_dim":4611686018427387904,"sliding_window":1}`), 1, 1)
	f.Add([]byte(`{"model_type":"mistral","num_hidden_layers":61,"kv_lora_rank":512,"qk_rope_head_dim":64,"sliding_window":16}`), 8, 16)
	f.Fuzz(func(t *testing.T, data []byte, tp, tokensPerBlock int) {
		m, err := parseHFConfig(data, "fuzz")
		if err != nil {
			return
		}
		if m.SlidingLayers < 0 || m.SlidingLayers > m.Layers || (m.SlidingLayers > 0) != (m.SlidingWindow > 0) {
			t.Fatalf("sliding-window layers of %+v", m)
		}
		for _, dtype := range []string{"fp32", "fp16", "fp8", "int4"} {
			var full planResult
			for _, mode := range []string{slidingFull, slidingWindow} {
				in := planInput{Model: m, DType: dtype, TP: tp, TokensPerBlock: tokensPerBlock, Concurrency: 64, AvgContext: 8192,
					GPUBytes: 80 << 30, HostBytes: 512 << 30, NVMeBytes: 4 << 40, SlidingMode: mode}
				if dtype == "int4" {
					in.QuantGroup = 64
				}
				r, err := computePlan(in)
				if err != nil {
					continue
				}
				if r.BytesPerTokenPerRank == 0 || r.BlockBytes != r.BytesPerTokenPerRank*uint64(tokensPerBlock) ||
					r.BytesPerToken != r.BytesPerTokenPerRank*uint64(tp) {
					t.Fatalf("inconsistent plan for %+v, %s, tp %d, %d tokens per block: %+v", m, dtype, tp, tokensPerBlock, r)
				}
				var layers int
				var blockBytes, perReq uint64
				for _, g := range r.BlockGroups {
					if g.BlocksPerRequest == 0 || g.BlocksPerRequest > r.BlocksPerRequest || g.BlockBytes == 0 {
						t.Fatalf("block group %+v of a request of %d blocks: %+v", g, r.BlocksPerRequest, r)
					}
					layers, blockBytes, perReq = layers+g.Layers, blockBytes+g.BlockBytes, perReq+g.BlocksPerRequest*g.BlockBytes
				}
				if layers != m.Layers || blockBytes != r.BlockBytes || perReq != r.BytesPerRequestPerRank {
					t.Fatalf("block groups do not add up, %s mode: %+v", mode, r)
				}
				switch mode {
				case slidingFull:
					full = r
					if r.BytesPerRequestPerRank != r.BlocksPerRequest*r.BlockBytes {
						t.Fatalf("full mode: a request is not its blocks: %+v", r)
					}
				case slidingWindow:
					if full.BlockBytes != 0 && r.BytesPerRequestPerRank > full.BytesPerRequestPerRank {
						t.Fatalf("window mode stores more than full mode: %d > %d B a request", r.BytesPerRequestPerRank, full.BytesPerRequestPerRank)
					}
				}
				held := r.ShortBytes
				for _, tier := range r.Tiers {
					if tier.UsableBytes > tier.CapacityBytes || tier.HoldsBytes > tier.UsableBytes || tier.BlocksFit > tier.UsableBytes {
						t.Fatalf("tier %+v holds more than its room", tier)
					}
					held += tier.HoldsBytes
				}
				if held != r.TotalBytes {
					t.Fatalf("tiers hold %d B and %d B are short of a %d B working set", held-r.ShortBytes, r.ShortBytes, r.TotalBytes)
				}
			}
		}
	})
}

// FuzzParseMix: an accepted --mix has a positive total and reads back the
// same from its canonical form.
func FuzzParseMix(f *testing.F) {
	for _, s := range []string{"put=1,get=3,lookup=0", "get=1", " PUT = 2 ,", "put=4294967295,get=4294967295,lookup=4294967295", "put=1,put=2"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		m, err := parseMix(s)
		if err != nil {
			return
		}
		if m.total() == 0 {
			t.Fatalf("parseMix(%q) accepted an all-zero mix", s)
		}
		again, err := parseMix(m.String())
		if err != nil || again != m {
			t.Fatalf("parseMix(%q) = %v, which reads back as %v, %v", s, m, again, err)
		}
	})
}
