package main

import (
	"encoding/json"
	"testing"
)

// FuzzPlanHFConfig: kvtierctl plan reads a model's config.json, which can
// hold anything. Whatever it holds, parsing and planning return a plan or
// an error, never a panic, and a plan's figures are positive and
// consistent: per-token bytes × tokens per block = block bytes, blocks of
// a request × block bytes = request bytes, on every tier split.
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
	f.Fuzz(func(t *testing.T, data []byte, tp, tokensPerBlock int) {
		m, err := parseHFConfig(data, "fuzz")
		if err != nil {
			return
		}
		for _, dtype := range []string{"fp32", "fp16", "fp8", "int4"} {
			in := planInput{Model: m, DType: dtype, TP: tp, TokensPerBlock: tokensPerBlock, Concurrency: 64, AvgContext: 8192,
				GPUBytes: 80 << 30, HostBytes: 512 << 30, NVMeBytes: 4 << 40}
			if dtype == "int4" {
				in.QuantGroup = 64
			}
			r, err := computePlan(in)
			if err != nil {
				continue
			}
			if r.BytesPerTokenPerRank == 0 || r.BlockBytes != r.BytesPerTokenPerRank*uint64(tokensPerBlock) ||
				r.BytesPerToken != r.BytesPerTokenPerRank*uint64(tp) ||
				r.BytesPerRequestPerRank != r.BlocksPerRequest*r.BlockBytes {
				t.Fatalf("inconsistent plan for %+v, %s, tp %d, %d tokens per block: %+v", m, dtype, tp, tokensPerBlock, r)
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
