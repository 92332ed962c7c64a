package main

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/kvtier/kvtier/daemon"
)

const (
	kib = uint64(1) << 10
	mib = uint64(1) << 20
	gib = uint64(1) << 30
)

func preset(t *testing.T, name string) modelSpec {
	t.Helper()
	m, err := presetModel(name)
	if err != nil {
		t.Fatal(err)
	}
	return m
}

func TestComputePlanArithmetic(t *testing.T) {
	tests := []struct {
		name        string
		model       string
		dtype       string
		group, tp   int
		tpb         int // 0: 16
		conc, ctx   int
		perTokRank  uint64
		perTok      uint64
		block       uint64
		blocksReq   uint64
		perReq      uint64
		total       uint64
		headsOnRank int
	}{
		// 2 (K,V) x 32 layers x 8 heads x 128 dim x 2 bytes.
		{"llama-3-8b bf16", "llama-3-8b", "bf16", 0, 1, 0, 64, 8192,
			131072, 131072, 16 * 131072, 512, 512 * 2 * mib, 64 * gib, 8},
		{"llama-3-8b fp16", "llama-3-8b", "fp16", 0, 1, 0, 1, 16,
			131072, 131072, 2 * mib, 1, 2 * mib, 2 * mib, 8},
		{"llama-3-8b fp32", "llama-3-8b", "fp32", 0, 1, 0, 1, 16,
			262144, 262144, 4 * mib, 1, 4 * mib, 4 * mib, 8},
		{"llama-3-8b fp8", "llama-3-8b", "fp8", 0, 1, 0, 1, 16,
			65536, 65536, mib, 1, mib, mib, 8},
		// int4: half a byte per element: 512 vectors x 64 B.
		{"llama-3-8b int4", "llama-3-8b", "int4", 0, 1, 0, 1, 16,
			32768, 32768, 512 * kib, 1, 512 * kib, 512 * kib, 8},
		// int4, fp16 scale per 32: a 128-element vector is 64 B + 4 x 2 B = 72 B; x 512.
		{"llama-3-8b int4 g32", "llama-3-8b", "int4", 32, 1, 0, 1, 16,
			36864, 36864, 16 * 36864, 1, 16 * 36864, 16 * 36864, 8},
		// int8, scale per 128: 128 + 2 = 130 B per vector.
		{"llama-3-8b int8 g128", "llama-3-8b", "int8", 128, 1, 0, 1, 16,
			512 * 130, 512 * 130, 16 * 512 * 130, 1, 16 * 512 * 130, 16 * 512 * 130, 8},
		// A group size that does not divide head_dim: ceil(128/48) = 3 scales.
		{"llama-3-8b int4 g48", "llama-3-8b", "int4", 48, 1, 0, 1, 16,
			512 * (64 + 6), 512 * (64 + 6), 16 * 512 * 70, 1, 16 * 512 * 70, 16 * 512 * 70, 8},
		// tp=2: 4 heads per rank, half per rank, same total.
		{"llama-3-8b tp2", "llama-3-8b", "bf16", 0, 2, 0, 64, 8192,
			65536, 131072, mib, 512, 1 * gib, 64 * gib, 4},
		// tp=16 > 8 heads: one head per rank, replicated twice.
		{"llama-3-8b tp16", "llama-3-8b", "bf16", 0, 16, 0, 1, 16,
			16384, 16 * 16384, 16 * 16384, 1, 16 * 16 * 16384, 16 * 16 * 16384, 1},
		{"llama-3-70b bf16", "llama-3-70b", "bf16", 0, 1, 0, 1, 16,
			327680, 327680, 16 * 327680, 1, 16 * 327680, 16 * 327680, 8},
		{"qwen2.5-7b bf16", "qwen2.5-7b", "bf16", 0, 1, 0, 1, 16,
			57344, 57344, 16 * 57344, 1, 16 * 57344, 16 * 57344, 4},
		{"mistral-7b bf16", "mistral-7b", "bf16", 0, 1, 0, 1, 16,
			131072, 131072, 2 * mib, 1, 2 * mib, 2 * mib, 8},
		{"mixtral-8x7b bf16", "mixtral-8x7b", "bf16", 0, 1, 0, 1, 16,
			131072, 131072, 2 * mib, 1, 2 * mib, 2 * mib, 8},
		{"gemma-2-9b bf16", "gemma-2-9b", "bf16", 0, 1, 0, 1, 16,
			344064, 344064, 16 * 344064, 1, 16 * 344064, 16 * 344064, 8},
		// MLA: 61 layers x (512 + 64) x 2 bytes, one latent, no K/V pair.
		{"deepseek-v3 bf16", "deepseek-v3", "bf16", 0, 1, 0, 64, 8192,
			70272, 70272, 16 * 70272, 512, 512 * 16 * 70272, 64 * 512 * 16 * 70272, 0},
		{"deepseek-v3 fp8", "deepseek-v3", "fp8", 0, 1, 0, 1, 16,
			35136, 35136, 16 * 35136, 1, 16 * 35136, 16 * 35136, 0},
		// 576 elements: 288 B + ceil(576/64) = 9 scales x 2 B = 306 B per layer.
		{"deepseek-v3 int4 g64", "deepseek-v3", "int4", 64, 1, 0, 1, 16,
			61 * 306, 61 * 306, 16 * 61 * 306, 1, 16 * 61 * 306, 16 * 61 * 306, 0},
		// MLA under tp: every rank keeps the whole latent.
		{"deepseek-v3 tp8", "deepseek-v3", "bf16", 0, 8, 0, 1, 16,
			70272, 8 * 70272, 16 * 70272, 1, 8 * 16 * 70272, 8 * 16 * 70272, 0},
		// A partial last block counts whole: 100 tokens = 7 blocks of 16.
		{"partial block", "llama-3-8b", "bf16", 0, 1, 0, 3, 100,
			131072, 131072, 2 * mib, 7, 14 * mib, 42 * mib, 8},
		{"tokens per block 32", "llama-3-8b", "bf16", 0, 1, 32, 2, 1000,
			131072, 131072, 4 * mib, 32, 128 * mib, 256 * mib, 8},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			tpb := tt.tpb
			if tpb == 0 {
				tpb = 16
			}
			r, err := computePlan(planInput{Model: preset(t, tt.model), DType: tt.dtype, QuantGroup: tt.group,
				TP: tt.tp, TokensPerBlock: tpb, Concurrency: tt.conc, AvgContext: tt.ctx})
			if err != nil {
				t.Fatal(err)
			}
			got := []uint64{r.BytesPerTokenPerRank, r.BytesPerToken, r.BlockBytes, r.BlocksPerRequest, r.BytesPerRequest, r.TotalBytes}
			want := []uint64{tt.perTokRank, tt.perTok, tt.block, tt.blocksReq, tt.perReq, tt.total}
			labels := []string{"bytes/token/rank", "bytes/token", "block bytes", "blocks/request", "bytes/request", "total bytes"}
			for i := range got {
				if got[i] != want[i] {
					t.Errorf("%s = %d, want %d", labels[i], got[i], want[i])
				}
			}
			if r.KVHeadsPerRank != tt.headsOnRank {
				t.Errorf("kv heads per rank = %d, want %d", r.KVHeadsPerRank, tt.headsOnRank)
			}
			if r.BytesPerRequestPerRank*uint64(tt.tp) != r.BytesPerRequest || r.TotalBytesPerRank*uint64(tt.tp) != r.TotalBytes {
				t.Errorf("per-rank and total disagree: %+v", r)
			}
		})
	}
}

func TestComputePlanTiers(t *testing.T) {
	base := planInput{Model: preset(t, "llama-3-8b"), DType: "bf16", TP: 1, TokensPerBlock: 16,
		Concurrency: 64, AvgContext: 8192} // 1 GiB per request, 64 GiB in all
	type tierWant struct {
		name           string
		capa, reqs     uint64
		holds          uint64
		blocks         uint64
		shareTimes1000 int
	}
	tests := []struct {
		name          string
		gpu, host, nv uint64
		tp            int
		tiers         []tierWant
		fitsIn        string
		spills        bool
		short         uint64
	}{
		{"no tiers", 0, 0, 0, 1, nil, "", false, 0},
		{"fits in host", 0, 100 * gib, 0, 1,
			[]tierWant{{"host", 100 * gib, 100, 64 * gib, 51200, 1000}}, "host", false, 0},
		{"spills into nvme", 20 * gib, 32 * gib, 1 << 40, 1,
			[]tierWant{
				// Under the high watermarks: 0.9 of the GPU's 20 GiB
				// (9216 blocks of 2 MiB), 0.95 of the host's 32 GiB
				// above NVMe (floor(32641751449.6 B / 2 MiB) = 15564).
				{"gpu", 20 * gib, 18, 18 * gib, 9216, 281},
				{"host", 32 * gib, 30, 15564 * 2 * mib, 15564, 474},
				// Up to the store's logical limit, 0.9 TiB =
				// 989560464998 B: 471816 blocks of 2 MiB + 192 B.
				{"nvme", 1 << 40, 921, 64*gib - 18*gib - 15564*2*mib, 471816, 243},
			}, "nvme", true, 0},
		{"gpu per GPU times tp", 40 * gib, 64 * gib, 0, 2,
			[]tierWant{
				// 0.9 of 80 GiB in 1 MiB blocks per rank; the host tier,
				// with no NVMe tier below, fills to its capacity.
				{"gpu", 80 * gib, 72, 64 * gib, 72 * 1024, 1000},
				{"host", 64 * gib, 64, 0, 64 * 1024, 0},
			}, "gpu", false, 0},
		{"does not fit", 0, 16 * gib, 16 * gib, 1,
			[]tierWant{
				// 0.95 of 16 GiB: floor(16320875724.8 B / 2 MiB) = 7782.
				{"host", 16 * gib, 15, 7782 * 2 * mib, 7782, 237},
				// Limit 16 GiB − (3·512 + 256 + 4) MiB = 15296626688
				// B: 7293 blocks of 2 MiB + 192 B.
				{"nvme", 16 * gib, 14, 7293 * 2 * mib, 7293, 222},
			}, "nvme", true, 64*gib - 7782*2*mib - 7293*2*mib},
		{"partial request", 0, gib + gib/2, 0, 1,
			[]tierWant{{"host", gib + gib/2, 1, gib + gib/2, 768, 23}}, "host", true, 64*gib - gib - gib/2},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			in := base
			in.GPUBytes, in.HostBytes, in.NVMeBytes, in.TP = tt.gpu, tt.host, tt.nv, tt.tp
			r, err := computePlan(in)
			if err != nil {
				t.Fatal(err)
			}
			if len(r.Tiers) != len(tt.tiers) {
				t.Fatalf("tiers = %+v, want %d", r.Tiers, len(tt.tiers))
			}
			for i, w := range tt.tiers {
				g := r.Tiers[i]
				if g.Name != w.name || g.CapacityBytes != w.capa || g.RequestsFit != w.reqs || g.HoldsBytes != w.holds ||
					g.BlocksFit != w.blocks || int(g.HoldsShare*1000) != w.shareTimes1000 {
					t.Errorf("tier %d = %+v, want %+v", i, g, w)
				}
			}
			if r.FitsIn != tt.fitsIn || r.Spills != tt.spills || r.ShortBytes != tt.short {
				t.Errorf("fits in %q, spills %v, short %d; want %q, %v, %d", r.FitsIn, r.Spills, r.ShortBytes, tt.fitsIn, tt.spills, tt.short)
			}
		})
	}
}

func TestComputePlanErrors(t *testing.T) {
	ok := planInput{Model: preset(t, "llama-3-8b"), DType: "bf16", TP: 1, TokensPerBlock: 16, Concurrency: 1, AvgContext: 1}
	tests := []struct {
		name string
		mod  func(*planInput)
		want string
	}{
		{"unknown dtype", func(in *planInput) { in.DType = "fp6" }, "--kv-dtype"},
		{"group on bf16", func(in *planInput) { in.QuantGroup = 32 }, "applies to int4 and int8"},
		{"negative group", func(in *planInput) { in.DType, in.QuantGroup = "int4", -1 }, "--quant-group"},
		{"tp 0", func(in *planInput) { in.TP = 0 }, "--tp"},
		{"tp 3 on 8 heads", func(in *planInput) { in.TP = 3 }, "do not split evenly"},
		{"tp 12 on 8 heads", func(in *planInput) { in.TP = 12 }, "not a multiple"},
		{"no concurrency", func(in *planInput) { in.Concurrency = 0 }, "--concurrency"},
		{"no context", func(in *planInput) { in.AvgContext = -5 }, "--avg-context"},
		{"no block", func(in *planInput) { in.TokensPerBlock = 0 }, "--tokens-per-block"},
		{"no layers", func(in *planInput) { in.Model.Layers = 0 }, "no layers"},
		{"no heads", func(in *planInput) { in.Model.KVHeads = 0 }, "kv heads"},
		{"overflow", func(in *planInput) { in.Concurrency, in.AvgContext = 1<<40, 1<<40 }, "overflow"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			in := ok
			tt.mod(&in)
			_, err := computePlan(in)
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("error = %v, want one containing %q", err, tt.want)
			}
		})
	}
	if _, err := presetModel("gpt-5"); err == nil || !strings.Contains(err.Error(), "llama-3-8b") {
		t.Errorf("unknown preset: %v", err)
	}
	if m, err := presetModel("Llama-3-8B"); err != nil || m.Layers != 32 {
		t.Errorf("preset names are case-insensitive: %+v, %v", m, err)
	}
}

func TestParseHFConfig(t *testing.T) {
	tests := []struct {
		name, json string
		want       modelSpec
		wantErr    string
	}{
		{"llama GQA", `{"_name_or_path":"meta-llama/Meta-Llama-3-8B","num_hidden_layers":32,"num_attention_heads":32,
			"num_key_value_heads":8,"hidden_size":4096}`,
			modelSpec{Name: "meta-llama/Meta-Llama-3-8B", Layers: 32, KVHeads: 8, HeadDim: 128}, ""},
		{"MHA: kv heads default to attention heads", `{"num_hidden_layers":24,"num_attention_heads":16,"hidden_size":2048}`,
			modelSpec{Name: "dir", Layers: 24, KVHeads: 16, HeadDim: 128}, ""},
		{"explicit head_dim wins", `{"num_hidden_layers":42,"num_attention_heads":16,"num_key_value_heads":8,
			"hidden_size":3584,"head_dim":256}`,
			modelSpec{Name: "dir", Layers: 42, KVHeads: 8, HeadDim: 256}, ""},
		{"null head_dim falls back", `{"num_hidden_layers":2,"num_attention_heads":4,"num_key_value_heads":2,"hidden_size":256,"head_dim":null}`,
			modelSpec{Name: "dir", Layers: 2, KVHeads: 2, HeadDim: 64}, ""},
		{"deepseek MLA", `{"model_type":"deepseek_v3","num_hidden_layers":61,"num_attention_heads":128,
			"num_key_value_heads":128,"hidden_size":7168,"kv_lora_rank":512,"qk_rope_head_dim":64,"qk_nope_head_dim":128,"v_head_dim":128}`,
			modelSpec{Name: "dir", Layers: 61, KVLoraRank: 512, QKRopeHeadDim: 64}, ""},
		{"kv_lora_rank null is not MLA", `{"num_hidden_layers":2,"num_attention_heads":2,"hidden_size":128,"kv_lora_rank":null}`,
			modelSpec{Name: "dir", Layers: 2, KVHeads: 2, HeadDim: 64}, ""},
		{"multimodal text_config", `{"_name_or_path":"llava","text_config":{"num_hidden_layers":32,"num_attention_heads":32,
			"num_key_value_heads":8,"hidden_size":4096},"vision_config":{"num_hidden_layers":24}}`,
			modelSpec{Name: "llava", Layers: 32, KVHeads: 8, HeadDim: 128}, ""},
		{"not JSON", `{"num_hidden_layers":`, modelSpec{}, "not a JSON object"},
		{"no layers", `{"num_attention_heads":32,"hidden_size":4096}`, modelSpec{}, "num_hidden_layers"},
		{"no heads", `{"num_hidden_layers":32,"hidden_size":4096}`, modelSpec{}, "num_key_value_heads"},
		{"no head_dim or hidden_size", `{"num_hidden_layers":32,"num_attention_heads":32}`, modelSpec{}, "head_dim"},
		{"hidden not divisible", `{"num_hidden_layers":32,"num_attention_heads":3,"hidden_size":4096}`, modelSpec{}, "not a multiple"},
		{"zero kv heads", `{"num_hidden_layers":32,"num_attention_heads":32,"num_key_value_heads":0,"hidden_size":4096}`, modelSpec{}, "num_key_value_heads"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := parseHFConfig([]byte(tt.json), "dir")
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("error = %v, want one containing %q", err, tt.wantErr)
				}
				return
			}
			if err != nil || got != tt.want {
				t.Fatalf("parseHFConfig = %+v, %v; want %+v", got, err, tt.want)
			}
		})
	}
}

func writeFile(t *testing.T, path, data string) string {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, []byte(data), 0o644); err != nil {
		t.Fatal(err)
	}
	return path
}

func planJSON(t *testing.T, args ...string) planResult {
	t.Helper()
	out := mustRun(t, append([]string{"plan", "--json"}, args...)...)
	var r planResult
	if err := json.Unmarshal([]byte(out), &r); err != nil {
		t.Fatalf("plan --json: %v\n%s", err, out)
	}
	return r
}

func TestPlanCommand(t *testing.T) {
	r := planJSON(t, "--model", "llama-3-8b", "--concurrency", "64", "--avg-context", "8192", "--kv-dtype", "bf16",
		"--gpu-bytes", "20GiB", "--host-bytes", "32GiB", "--nvme-bytes", "1TiB")
	if r.BytesPerToken != 131072 || r.TotalBytes != 64*gib || r.FitsIn != "nvme" || !r.Spills || len(r.Tiers) != 3 || r.TierSource != "flags" {
		t.Errorf("llama-3-8b plan: %+v", r)
	}

	// A config.json names the model after its directory when it has no
	// _name_or_path.
	path := writeFile(t, filepath.Join(t.TempDir(), "DeepSeek-V3", "config.json"),
		`{"num_hidden_layers":61,"num_attention_heads":128,"kv_lora_rank":512,"qk_rope_head_dim":64}`)
	r = planJSON(t, "--hf-config", path, "--concurrency", "64", "--avg-context", "8192", "--kv-dtype", "BF16", "--tp", "8")
	if r.Model.Name != "DeepSeek-V3" || r.Attention != "mla" || r.BytesPerTokenPerRank != 70272 || r.BytesPerToken != 8*70272 || len(r.Tiers) != 0 {
		t.Errorf("deepseek config plan: %+v", r)
	}

	out := mustRun(t, "plan", "--model", "deepseek-v3", "--concurrency", "64", "--avg-context", "8192", "--host-bytes", "16GiB")
	for _, want := range []string{"MLA: 61 layers x latent 512 + rope 64", "70272", "per request", "does not fit", "host"} {
		if !strings.Contains(out, want) {
			t.Errorf("plan table lacks %q:\n%s", want, out)
		}
	}
	out = mustRun(t, "plan", "--model", "qwen2.5-7b", "--kv-dtype", "int4", "--quant-group", "32")
	if !strings.Contains(out, "GQA: 28 layers x 4 KV heads x 128 dim") || !strings.Contains(out, "no tier sizes") {
		t.Errorf("plan table:\n%s", out)
	}

	for _, args := range [][]string{
		{"plan"}, // no model
		{"plan", "--model", "llama-3-8b", "--hf-config", path},
		{"plan", "--model", "nope"},
		{"plan", "--hf-config", filepath.Join(t.TempDir(), "missing.json")},
		{"plan", "--hf-config", writeFile(t, filepath.Join(t.TempDir(), "config.json"), `{}`)},
		{"plan", "--model", "llama-3-8b", "--kv-dtype", "fp4"},
		{"plan", "--model", "llama-3-8b", "--host-bytes", "lots"},
		{"plan", "--model", "llama-3-8b", "--tp", "3"},
	} {
		if _, err := run(t, args...); err == nil {
			t.Errorf("%v succeeded", args)
		}
	}
}

// plan --socket takes the tier sizes from the daemon, "explicit size flags
// still win" (--help), and a size of 0 is an absent tier. An explicit
// --host-bytes 0 was taken for "not given": the daemon's host tier was
// planned with anyway.
func TestPlanLiveExplicitFlags(t *testing.T) {
	sock, _ := restartableDaemon(t, t.TempDir(), 32)
	base := []string{"--model", "llama-3-8b", "--concurrency", "4", "--avg-context", "1024", "--socket", sock}
	for _, tc := range []struct {
		flags  []string
		tiers  []string
		caps   []uint64
		source string
	}{
		{nil, []string{"host"}, []uint64{32 * mib}, "kvtierd at " + sock},
		{[]string{"--host-bytes", "1GiB"}, []string{"host"}, []uint64{gib}, "kvtierd at " + sock + " and flags"},
		{[]string{"--host-bytes", "0", "--gpu-bytes", "1GiB"}, []string{"gpu"}, []uint64{gib}, "kvtierd at " + sock + " and flags"},
		{[]string{"--host-bytes", "0"}, nil, nil, "kvtierd at " + sock + " and flags"},
	} {
		r := planJSON(t, append(base, tc.flags...)...)
		var names []string
		var caps []uint64
		for _, tier := range r.Tiers {
			names, caps = append(names, tier.Name), append(caps, tier.CapacityBytes)
		}
		if strings.Join(names, ",") != strings.Join(tc.tiers, ",") || fmt.Sprint(caps) != fmt.Sprint(tc.caps) || r.TierSource != tc.source {
			t.Errorf("plan %v: tiers %v %v from %q; want %v %v from %q", tc.flags, names, caps, r.TierSource, tc.tiers, tc.caps, tc.source)
		}
	}
}

// The NVMe store evicts above its logical limit, min(C − 3·F − C/64 − 4 MiB,
// 0.9·C) with F = clamp(C/32, 16 MiB, 1 GiB − 1) (tiers/nvme "Byte budget"),
// and charges each block 192 bytes on top of its payload. The planner took
// the whole capacity as block bytes: a 64 GiB working set "fit" a 64 GiB
// NVMe tier that evicts from 57.6 GiB on.
func TestPlanNVMeLogicalLimit(t *testing.T) {
	const block = 2 * mib // llama-3-8b bf16, 16 tokens
	tests := []struct {
		name                 string
		nvme                 uint64
		usable, blocks, reqs uint64
		short                uint64
		wantErr              string
	}{
		// C = 64 GiB: F = 2^30 − 1, reserve = 3F + 1 GiB + 4 MiB =
		// 4299161597 < C/10, so the limit is 0.9·C = 61847529062;
		// 61847529062 / (2 MiB + 192) = 29488 blocks, 57 requests of 512.
		{"64 GiB", 64 * gib, 29488 * block, 29488, 57, 64*gib - 29488*block, ""},
		// C = 1 GiB: F = 32 MiB, reserve = 96 + 16 + 4 MiB: the limit is
		// C − 116 MiB = 952107008 (below 0.9·C); 453 blocks.
		{"1 GiB", gib, 453 * block, 453, 0, 64*gib - 453*block, ""},
		// The daemon takes up to MaxInt64: 0.9 of it, not a wrapped C·9.
		{"8 EiB", 1 << 63, 8301034833169298226 / (block + 192) * block, 8301034833169298226 / (block + 192), 8301034833169298226 / (block + 192) / 512, 0, ""},
		{"below the minimum", 32 * mib, 0, 0, 0, 0, "minimum"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r, err := computePlan(planInput{Model: preset(t, "llama-3-8b"), DType: "bf16", TP: 1, TokensPerBlock: 16,
				Concurrency: 64, AvgContext: 8192, NVMeBytes: tt.nvme})
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("error = %v, want one containing %q", err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if len(r.Tiers) != 1 {
				t.Fatalf("tiers = %+v", r.Tiers)
			}
			nv := r.Tiers[0]
			holds := min(64*gib, tt.blocks*block)
			if nv.UsableBytes != tt.usable || nv.BlocksFit != tt.blocks || nv.RequestsFit != tt.reqs || nv.HoldsBytes != holds {
				t.Errorf("nvme tier usable %d, %d blocks, %d requests, holds %d; want %d, %d, %d, %d",
					nv.UsableBytes, nv.BlocksFit, nv.RequestsFit, nv.HoldsBytes, tt.usable, tt.blocks, tt.reqs, holds)
			}
			if r.ShortBytes != tt.short || r.Spills != (tt.short > 0) {
				t.Errorf("short %d, spills %v; want %d, %v", r.ShortBytes, r.Spills, tt.short, tt.short > 0)
			}
		})
	}
}

// The host tier's allocator cuts each slab (host.slab_bytes, 64 MiB by
// default) into floor(slab / stride) slots, the stride being the block size
// rounded up to 4 KiB, and refuses a block larger than a slab
// (tiers/doc.go). The planner divided the capacity by the block size: it
// overstated the blocks a host tier holds, and planned blocks no slab holds.
func TestPlanHostSlabPacking(t *testing.T) {
	tests := []struct {
		name           string
		model          string
		tpb            int
		slab, host     uint64
		blocks, reqs   uint64
		holds, short   uint64
		wantErr        string
		conc, avgCtxTk int
	}{
		// llama-3-70b bf16, 16 tokens: 16 x 327680 B = 5 MiB, 12 per
		// 64 MiB slab (60 MiB used), 1024 slabs in 64 GiB: 12288 blocks
		// (not 13107); a request is 512 blocks: 24 requests (not 25).
		{"llama-3-70b 5 MiB blocks", "llama-3-70b", 16, 0, 64 * gib, 12288, 24, 12288 * 5 * mib, 32*512*5*mib - 12288*5*mib, "", 32, 8192},
		// deepseek-v3 bf16, 16 tokens: 16 x 70272 = 1124352 B, stride
		// 275 pages = 1126400 B, 59 per slab; 16 slabs in 1 GiB: 944
		// blocks (not 954).
		{"deepseek-v3 unaligned blocks", "deepseek-v3", 16, 0, gib, 944, 944 / 7, 21 * 7 * 1124352, 0, "", 21, 100},
		// 256 tokens of llama-3-70b: 80 MiB, larger than a 64 MiB slab.
		{"block larger than a slab", "llama-3-70b", 256, 0, gib, 0, 0, 0, 0, "slab", 1, 256},
		// With 128 MiB slabs: one 80 MiB block per slab, 8 in 1 GiB.
		{"slab-bytes 128MiB", "llama-3-70b", 256, 128 * mib, gib, 8, 8, 8 * 80 * mib, 2 * 80 * mib, "", 10, 256},
		{"slab-bytes not a power of two", "llama-3-8b", 16, 96 * mib, gib, 0, 0, 0, 0, "--slab-bytes", 1, 16},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r, err := computePlan(planInput{Model: preset(t, tt.model), DType: "bf16", TP: 1, TokensPerBlock: tt.tpb,
				Concurrency: tt.conc, AvgContext: tt.avgCtxTk, HostBytes: tt.host, SlabBytes: tt.slab})
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("error = %v, want one containing %q", err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			h := r.Tiers[0]
			if h.UsableBytes != tt.blocks*r.BlockBytes {
				t.Errorf("host tier usable %d, want %d blocks of %d", h.UsableBytes, tt.blocks, r.BlockBytes)
			}
			if h.BlocksFit != tt.blocks || h.RequestsFit != tt.reqs || h.HoldsBytes != tt.holds || r.ShortBytes != tt.short {
				t.Errorf("host tier %d blocks, %d requests, holds %d, short %d; want %d, %d, %d, %d",
					h.BlocksFit, h.RequestsFit, h.HoldsBytes, r.ShortBytes, tt.blocks, tt.reqs, tt.holds, tt.short)
			}
		})
	}
	// The flag reaches the planner.
	r := planJSON(t, "--model", "llama-3-70b", "--tokens-per-block", "256", "--avg-context", "256", "--host-bytes", "1GiB", "--slab-bytes", "128MiB")
	if len(r.Tiers) != 1 || r.Tiers[0].BlocksFit != 8 {
		t.Errorf("plan --slab-bytes 128MiB: %+v", r.Tiers)
	}
	if _, err := run(t, "plan", "--model", "llama-3-70b", "--tokens-per-block", "256", "--host-bytes", "1GiB"); err == nil {
		t.Error("plan of 80 MiB blocks in 64 MiB slabs succeeded")
	}
}

// plan --socket packs the host tier with the daemon's own slab size: this
// daemon's 32 MiB host tier is two 16 MiB slabs of eight 2 MiB blocks each,
// 16 blocks, where 64 MiB slabs would hold none.
func TestPlanLiveSlabBytes(t *testing.T) {
	sock, _ := restartableDaemon(t, t.TempDir(), 32) // host.slab_bytes 16 MiB
	base := []string{"--model", "llama-3-8b", "--concurrency", "4", "--avg-context", "1024", "--socket", sock}
	for _, tc := range []struct {
		flags  []string
		blocks uint64
	}{
		{nil, 16},
		{[]string{"--slab-bytes", "32MiB"}, 16},
		{[]string{"--slab-bytes", "64MiB"}, 0},
	} {
		r := planJSON(t, append(base, tc.flags...)...)
		if len(r.Tiers) != 1 || r.Tiers[0].Name != "host" || r.Tiers[0].BlocksFit != tc.blocks {
			t.Errorf("plan %v: tiers %+v, want a host tier of %d blocks", tc.flags, r.Tiers, tc.blocks)
		}
	}
}

// transformers reads a field absent from config.json as the model class's
// default, and a multimodal model's text_config is written as a diff
// against those defaults. Gemma 3 12B's text_config (below, as published)
// omits head_dim (256, the class default): the planner took hidden_size /
// num_attention_heads = 3840 / 16 = 240 and undersized its KV by 6.25%.
// Gemma 3 4B's omits the heads too (8 and 4 KV heads by default), and
// both omit sliding_window_pattern (6: five local layers, then a global
// one): 48 - 48/6 = 40 and 34 - 34/6 = 29 local layers.
func TestParseHFConfigClassDefaults(t *testing.T) {
	tests := []struct {
		name, json string
		want       modelSpec
		perToken   uint64 // bf16: 2 x layers x kv heads x head_dim x 2 B
	}{
		{"gemma-3-12b", `{"architectures":["Gemma3ForConditionalGeneration"],"model_type":"gemma3","mm_tokens_per_image":256,
			"text_config":{"hidden_size":3840,"intermediate_size":15360,"model_type":"gemma3_text","num_attention_heads":16,
			"num_hidden_layers":48,"num_key_value_heads":8,"rope_scaling":{"factor":8.0,"rope_type":"linear"},"sliding_window":1024},
			"torch_dtype":"bfloat16","vision_config":{"hidden_size":1152,"model_type":"siglip_vision_model","num_hidden_layers":27}}`,
			modelSpec{Name: "dir", Layers: 48, KVHeads: 8, HeadDim: 256, SlidingLayers: 40, SlidingWindow: 1024}, 2 * 48 * 8 * 256 * 2},
		{"gemma-3-4b", `{"model_type":"gemma3","text_config":{"hidden_size":2560,"intermediate_size":10240,
			"model_type":"gemma3_text","num_hidden_layers":34,"sliding_window":1024}}`,
			modelSpec{Name: "dir", Layers: 34, KVHeads: 4, HeadDim: 256, SlidingLayers: 29, SlidingWindow: 1024}, 2 * 34 * 4 * 256 * 2},
		// Gemma 2 9B without its head_dim: 256, not 3584 / 16 = 224.
		{"gemma2 without head_dim", `{"model_type":"gemma2","num_hidden_layers":42,"num_attention_heads":16,
			"num_key_value_heads":8,"hidden_size":3584}`,
			modelSpec{Name: "dir", Layers: 42, KVHeads: 8, HeadDim: 256}, 2 * 42 * 8 * 256 * 2},
		// Other model types keep the generic fallbacks.
		{"llama without head_dim", `{"model_type":"llama","num_hidden_layers":32,"num_attention_heads":32,"hidden_size":4096}`,
			modelSpec{Name: "dir", Layers: 32, KVHeads: 32, HeadDim: 128}, 2 * 32 * 32 * 128 * 2},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := parseHFConfig([]byte(tt.json), "dir")
			if err != nil || got != tt.want {
				t.Fatalf("parseHFConfig = %+v, %v; want %+v", got, err, tt.want)
			}
			r, err := computePlan(planInput{Model: got, DType: "bf16", TP: 1, TokensPerBlock: 16, Concurrency: 1, AvgContext: 16})
			if err != nil || r.BytesPerToken != tt.perToken {
				t.Fatalf("bytes per token = %d, %v; want %d", r.BytesPerToken, err, tt.perToken)
			}
		})
	}
}

// --hf-config given a weights file or a device by mistake: plan read it
// into memory whole (/dev/zero until the process ran out of memory). It
// now reads at most 16 MiB and says the file is no config.json.
func TestLoadHFConfigBounded(t *testing.T) {
	big := filepath.Join(t.TempDir(), "model.safetensors")
	f, err := os.Create(big)
	if err != nil {
		t.Fatal(err)
	}
	if err := f.Truncate(1 << 40); err != nil { // sparse: no disk used
		f.Close()
		t.Skipf("sparse file: %v", err)
	}
	f.Close()
	for _, path := range []string{"/dev/zero", big} {
		if _, err := loadHFConfig(path); err == nil || !strings.Contains(err.Error(), "not a config.json") {
			t.Errorf("loadHFConfig(%s) = %v, want a not-a-config.json error", path, err)
		}
	}
	// A config.json of any plausible size still reads.
	path := writeFile(t, filepath.Join(t.TempDir(), "m", "config.json"),
		`{"num_hidden_layers":2,"num_attention_heads":2,"hidden_size":128,"pad":"`+strings.Repeat("x", 1<<20)+`"}`)
	if m, err := loadHFConfig(path); err != nil || m.Layers != 2 {
		t.Errorf("loadHFConfig of a 1 MiB config = %+v, %v", m, err)
	}
}

// A tier with a tier below it demotes above its high watermark (the host
// tier only above an NVMe tier: tiers/chain.go), down to its low one: a
// working set between the two is demoted again and again. The planner
// counted the whole capacity as room, so it planned such a working set as
// fitting. llama-3-8b bf16, 16 tokens: 2 MiB blocks, 512 of them in 1 GiB.
func TestPlanHighWatermarks(t *testing.T) {
	const block = 2 * mib
	tests := []struct {
		name              string
		gpu, host, nvme   uint64
		hostHigh, gpuHigh float64
		wantGPU, wantHost uint64
	}{
		{"host without nvme fills to capacity", 0, gib, 0, 0, 0, 0, 512},
		// floor(0.95 GiB) / 2 MiB = 486.4
		{"host above nvme: default 0.95", 0, gib, 64 * gib, 0, 0, 0, 486},
		{"host above nvme: 0.5", 0, gib, 64 * gib, 0.5, 0, 0, 256},
		// A full tier is above any high watermark (tiers/chain.go: above):
		// the mover demotes it, so at 1 it keeps one block less.
		{"host above nvme: 1", 0, gib, 64 * gib, 1, 0, 0, 511},
		// floor(0.9 GiB) / 2 MiB = 460.8
		{"gpu: default 0.9", gib, gib, 0, 0, 0, 460, 512},
		{"gpu: 0.25", gib, 0, 0, 0, 0.25, 128, 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r, err := computePlan(planInput{Model: preset(t, "llama-3-8b"), DType: "bf16", TP: 1, TokensPerBlock: 16,
				Concurrency: 1, AvgContext: 16, GPUBytes: tt.gpu, HostBytes: tt.host, NVMeBytes: tt.nvme,
				HostHigh: tt.hostHigh, GPUHigh: tt.gpuHigh})
			if err != nil {
				t.Fatal(err)
			}
			if r.BlockBytes != block {
				t.Fatalf("block of %d bytes, want %d", r.BlockBytes, block)
			}
			for _, tier := range r.Tiers {
				want := map[string]uint64{"gpu": tt.wantGPU, "host": tt.wantHost}[tier.Name]
				if tier.Name == "nvme" {
					continue
				}
				if tier.BlocksFit != want || tier.UsableBytes != want*block {
					t.Errorf("%s tier: %d blocks (%d usable bytes), want %d", tier.Name, tier.BlocksFit, tier.UsableBytes, want)
				}
			}
		})
	}
	for _, args := range [][]string{
		{"--host-high-watermark", "0"},
		{"--host-high-watermark", "1.5"},
		{"--gpu-high-watermark", "-1"},
	} {
		if _, err := run(t, append([]string{"plan", "--model", "llama-3-8b", "--host-bytes", "1GiB"}, args...)...); err == nil || !strings.Contains(err.Error(), "watermark") {
			t.Errorf("plan %v: %v, want a watermark error", args, err)
		}
	}

	// plan --socket takes the daemon's own watermark: a 32 MiB host tier
	// (two 16 MiB slabs of eight 2 MiB blocks) above NVMe with
	// host.high_watermark 0.5 keeps 8 blocks; an explicit flag wins.
	sock, _ := startDaemonIn(t, t.TempDir(), func(cfg *daemon.Config) {
		cfg.Host.SlabBytes, cfg.Host.Capacity, cfg.Host.Prefault = 16<<20, 32<<20, false
		cfg.Host.HighWatermark, cfg.Host.LowWatermark = 0.5, 0.4
		cfg.NVMe.Enabled, cfg.NVMe.Capacity = true, 128<<20
	})
	base := []string{"--model", "llama-3-8b", "--concurrency", "4", "--avg-context", "1024", "--socket", sock, "--nvme-bytes", "0"}
	for _, tc := range []struct {
		flags  []string
		blocks uint64
	}{
		{nil, 16}, // no NVMe tier in the plan: the host tier fills
		{[]string{"--nvme-bytes", "1GiB"}, 8},
		{[]string{"--nvme-bytes", "1GiB", "--host-high-watermark", "1"}, 15}, // full is above
	} {
		r := planJSON(t, append(base, tc.flags...)...)
		if len(r.Tiers) == 0 || r.Tiers[0].Name != "host" || r.Tiers[0].BlocksFit != tc.blocks {
			t.Errorf("plan %v: tiers %+v, want a host tier of %d blocks", tc.flags, r.Tiers, tc.blocks)
		}
	}
}
