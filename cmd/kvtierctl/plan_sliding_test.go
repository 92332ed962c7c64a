package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"path/filepath"
	"strings"
	"testing"

	"github.com/kvtier/kvtier/shm"
	"github.com/kvtier/kvtier/tiers"
)

// Published config.json files (the fields that size the KV cache).
const (
	gemma2Config = `{"_name_or_path":"google/gemma-2-9b","model_type":"gemma2","num_hidden_layers":42,
		"num_attention_heads":16,"num_key_value_heads":8,"head_dim":256,"hidden_size":3584,"sliding_window":4096}`
	gemma3Config = `{"_name_or_path":"google/gemma-3-1b-it","model_type":"gemma3_text","num_hidden_layers":26,
		"num_attention_heads":4,"num_key_value_heads":1,"head_dim":256,"hidden_size":1152,
		"sliding_window":512,"sliding_window_pattern":6}`
	qwen2Config = `{"_name_or_path":"Qwen/Qwen2.5-7B-Instruct","model_type":"qwen2","num_hidden_layers":28,
		"num_attention_heads":28,"num_key_value_heads":4,"hidden_size":3584,
		"sliding_window":131072,"max_window_layers":28,"use_sliding_window":false}`
	mistral01Config = `{"_name_or_path":"mistralai/Mistral-7B-v0.1","model_type":"mistral","num_hidden_layers":32,
		"num_attention_heads":32,"num_key_value_heads":8,"hidden_size":4096,"sliding_window":4096}`
)

// gptOSSConfig is gpt-oss-20b's: layer_types alternate, sliding first.
var gptOSSConfig = `{"_name_or_path":"openai/gpt-oss-20b","model_type":"gpt_oss","num_hidden_layers":24,
	"num_attention_heads":64,"num_key_value_heads":8,"head_dim":64,"hidden_size":2880,"sliding_window":128,
	"layer_types":[` + strings.TrimSuffix(strings.Repeat(`"sliding_attention","full_attention",`, 12), ",") + `]}`

// slidingPlan is what TestPlanSlidingWindow reads of plan --json, declared
// here so that the test runs against a plan without these fields too.
type slidingPlan struct {
	Model struct {
		SlidingLayers int `json:"sliding_layers"`
		SlidingWindow int `json:"sliding_window"`
	} `json:"model"`
	Mode             string        `json:"sliding_window_mode"`
	Groups           []slidingBlks `json:"block_groups"`
	BlocksPerRequest uint64        `json:"blocks_per_request_per_rank"`
	PerRequest       uint64        `json:"bytes_per_request_per_rank"`
	Total            uint64        `json:"total_bytes"`
	Tiers            []struct {
		Usable   uint64 `json:"usable_bytes"`
		Requests uint64 `json:"requests_fit"`
		Blocks   uint64 `json:"blocks_fit"`
	} `json:"tiers"`
	Short uint64 `json:"short_bytes"`
}

type slidingBlks struct {
	Attention string `json:"attention"`
	Layers    int    `json:"layers"`
	Bytes     uint64 `json:"block_bytes"`
	Blocks    uint64 `json:"blocks_per_request_per_rank"`
}

// plan ignored sliding-window layers: every model was sized as if each
// layer kept every token, and --hf-config read no window. Now the model
// reports them, and --sliding-window window sizes an engine that keeps a
// sliding-window layer's KV for the blocks of a request's last window
// tokens only: its full-attention layers' blocks (every block) and its
// sliding-window layers' blocks (the window's) are a namespace each.
// bf16, tp 1, 16 tokens per block; "per layer" is one layer's 16-token
// block, 2 (K, V) x KV heads x head_dim x 2 B x 16.
func TestPlanSlidingWindow(t *testing.T) {
	type host struct{ usable, reqs, blocks uint64 }
	tests := []struct {
		name, config, mode string // mode "": the default
		ctx, conc          int
		hostBytes          string
		sliding, window    int
		blocks             uint64 // blocks of context per request
		groups             []slidingBlks
		perReq, total      uint64
		host               *host
		short              uint64
	}{
		// Gemma 2 9B: 21 of 42 layers (the even ones) local over 4096
		// tokens; per layer 2 x 8 x 256 x 2 x 16 = 131072 B. Full: a
		// block is 42 x 131072 = 5505024 B, 512 of them a request
		// (2818572288 B). 64 GiB of 64 MiB slabs hold 12 a slab: 12288
		// blocks, 24 requests.
		{"gemma2 full", gemma2Config, "", 8192, 8, "64GiB", 21, 4096, 512,
			[]slidingBlks{{"all", 42, 5505024, 512}}, 2818572288, 8 * 2818572288,
			&host{12288 * 5505024, 24, 12288}, 0},
		// Window: 512 blocks of the 21 full layers (2752512 B each) and
		// the 4096 / 16 = 256 last of the 21 local ones: 768 x 2752512 =
		// 2113929216 B. The two sizes are equal, one slab class: 24 a
		// slab, 24576 blocks, 24576 / 768 = 32 requests.
		{"gemma2 window above", gemma2Config, "window", 8192, 8, "64GiB", 21, 4096, 512,
			[]slidingBlks{{"full_attention", 21, 2752512, 512}, {"sliding_attention", 21, 2752512, 256}},
			2113929216, 8 * 2113929216, &host{24576 * 2752512, 32, 24576}, 0},
		// A context that ends inside a block: 8200 tokens are 513 blocks;
		// the last 4096 (4104..8199) lie in blocks 256..512: 257.
		// (513 + 257) x 2752512 = 2119434240.
		{"gemma2 window above, partial block", gemma2Config, "window", 8200, 1, "", 21, 4096, 513,
			[]slidingBlks{{"full_attention", 21, 2752512, 513}, {"sliding_attention", 21, 2752512, 257}},
			2119434240, 2119434240, nil, 0},
		// Below the window every block keeps every layer: 128 x 2 x
		// 2752512 = 128 x 5505024 = 704643072, as in full mode.
		{"gemma2 window below", gemma2Config, "window", 2048, 1, "", 21, 4096, 128,
			[]slidingBlks{{"full_attention", 21, 2752512, 128}, {"sliding_attention", 21, 2752512, 128}},
			704643072, 704643072, nil, 0},
		{"gemma2 full below", gemma2Config, "full", 2048, 1, "", 21, 4096, 128,
			[]slidingBlks{{"all", 42, 5505024, 128}}, 704643072, 704643072, nil, 0},

		// Gemma 3 1B: sliding_window_pattern 6, so layers 5, 11, 17, 23
		// are global and 22 of 26 local over 512 tokens; per layer 2 x 1
		// x 256 x 2 x 16 = 16384 B. Full: 256 x 26 x 16384 = 109051904.
		{"gemma3 pattern full", gemma3Config, "full", 4096, 1, "", 22, 512, 256,
			[]slidingBlks{{"all", 26, 425984, 256}}, 109051904, 109051904, nil, 0},
		// Window: 256 blocks of 4 x 16384 = 65536 B and the last 512 / 16
		// = 32 of 22 x 16384 = 360448 B: 16777216 + 11534336 = 28311552.
		// Two sizes in a 1 GiB host tier (16 slabs of 64 MiB), counted
		// in the request's mix, two slabs short: 65536 B blocks take
		// 64 MiB / 1024 = 65536 B, 360448 B ones 64 MiB / 186 rounded up
		// = 360801 B; a request 256 x 65536 + 32 x 360801 = 28322848 B of
		// the 1 GiB - 128 MiB = 939524096 B: 33 requests, and
		// floor(939524096 x 256 / 28322848) = 8492 and
		// floor(939524096 x 32 / 28322848) = 1061 blocks, 8492 x 65536 +
		// 1061 x 360448 = 938967040 B. 40 requests are 1132462080 B.
		{"gemma3 pattern window above", gemma3Config, "window", 4096, 40, "1GiB", 22, 512, 256,
			[]slidingBlks{{"full_attention", 4, 65536, 256}, {"sliding_attention", 22, 360448, 32}},
			28311552, 40 * 28311552, &host{938967040, 33, 8492 + 1061}, 40*28311552 - 938967040},
		// 300 tokens (19 blocks) are within the window: 19 x 425984.
		{"gemma3 pattern window below", gemma3Config, "window", 300, 1, "", 22, 512, 19,
			[]slidingBlks{{"full_attention", 4, 65536, 19}, {"sliding_attention", 22, 360448, 19}},
			8093696, 8093696, nil, 0},

		// gpt-oss-20b: layer_types, 12 of 24 sliding over 128 tokens;
		// per layer 2 x 8 x 64 x 2 x 16 = 32768 B, a group's block 12 x
		// 32768 = 393216. 1000 tokens are 63 blocks; the last 128
		// (872..999) lie in blocks 54..62: 9. (63 + 9) x 393216.
		{"layer_types window", gptOSSConfig, "window", 1000, 1, "", 12, 128, 63,
			[]slidingBlks{{"full_attention", 12, 393216, 63}, {"sliding_attention", 12, 393216, 9}},
			28311552, 28311552, nil, 0},
		{"layer_types full", gptOSSConfig, "", 1000, 1, "", 12, 128, 63,
			[]slidingBlks{{"all", 24, 786432, 63}}, 49545216, 49545216, nil, 0},
		// A window of 128 tokens under a 100-token context: all 7 blocks.
		{"layer_types window below", gptOSSConfig, "window", 100, 1, "", 12, 128, 7,
			[]slidingBlks{{"full_attention", 12, 393216, 7}, {"sliding_attention", 12, 393216, 7}},
			14 * 393216, 14 * 393216, nil, 0},

		// Qwen2.5 7B writes a sliding_window it does not use
		// (use_sliding_window false): full attention in either mode, 512
		// blocks of 28 x 2 x 4 x 128 x 2 x 16 = 917504 B.
		{"qwen2 use_sliding_window false", qwen2Config, "window", 8192, 1, "", 0, 0, 512,
			[]slidingBlks{{"all", 28, 917504, 512}}, 469762048, 469762048, nil, 0},

		// Mistral 7B v0.1: every layer local over 4096 tokens; per layer
		// 2 x 8 x 128 x 2 x 16 = 65536 B, a block 2 MiB. Full: 512
		// blocks, 1 GiB a request; 1 GiB of host holds 512 blocks, one
		// request.
		{"mistral v0.1 full", mistral01Config, "", 8192, 8, "1GiB", 32, 4096, 512,
			[]slidingBlks{{"all", 32, 2 * mib, 512}}, gib, 8 * gib, &host{gib, 1, 512}, 7 * gib},
		// Window: only the last 256 blocks: 512 MiB; two requests fit.
		{"mistral v0.1 window above", mistral01Config, "window", 8192, 8, "1GiB", 32, 4096, 512,
			[]slidingBlks{{"sliding_attention", 32, 2 * mib, 256}}, 512 * mib, 4 * gib, &host{gib, 2, 512}, 3 * gib},
		{"mistral v0.1 window below", mistral01Config, "window", 1000, 1, "", 32, 4096, 63,
			[]slidingBlks{{"sliding_attention", 32, 2 * mib, 63}}, 63 * 2 * mib, 63 * 2 * mib, nil, 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			path := writeFile(t, filepath.Join(t.TempDir(), "m", "config.json"), tt.config)
			args := []string{"plan", "--json", "--hf-config", path, "--avg-context", fmt.Sprint(tt.ctx), "--concurrency", fmt.Sprint(tt.conc)}
			if tt.mode != "" {
				args = append(args, "--sliding-window", tt.mode)
			}
			if tt.hostBytes != "" {
				args = append(args, "--host-bytes", tt.hostBytes)
			}
			out, err := run(t, args...)
			if err != nil {
				t.Fatalf("plan %v: %v", args[2:], err)
			}
			var r slidingPlan
			if err := json.Unmarshal([]byte(out), &r); err != nil {
				t.Fatal(err)
			}
			if r.Model.SlidingLayers != tt.sliding || r.Model.SlidingWindow != tt.window {
				t.Errorf("sliding_layers %d, sliding_window %d; want %d, %d", r.Model.SlidingLayers, r.Model.SlidingWindow, tt.sliding, tt.window)
			}
			if want := cmpOr(tt.mode, "full"); r.Mode != want {
				t.Errorf("sliding_window_mode %q, want %q", r.Mode, want)
			}
			if fmt.Sprint(r.Groups) != fmt.Sprint(tt.groups) {
				t.Errorf("block_groups %v, want %v", r.Groups, tt.groups)
			}
			if r.BlocksPerRequest != tt.blocks || r.PerRequest != tt.perReq || r.Total != tt.total {
				t.Errorf("%d blocks, %d B a request, %d B in all; want %d, %d, %d", r.BlocksPerRequest, r.PerRequest, r.Total, tt.blocks, tt.perReq, tt.total)
			}
			if tt.host != nil {
				if len(r.Tiers) != 1 {
					t.Fatalf("tiers %+v", r.Tiers)
				}
				if h := r.Tiers[0]; h.Usable != tt.host.usable || h.Requests != tt.host.reqs || h.Blocks != tt.host.blocks || r.Short != tt.short {
					t.Errorf("host tier: %d usable, %d requests, %d blocks, short %d; want %d, %d, %d, %d",
						h.Usable, h.Requests, h.Blocks, r.Short, tt.host.usable, tt.host.reqs, tt.host.blocks, tt.short)
				}
			}
		})
	}
	if _, err := run(t, "plan", "--model", "gemma-2-9b", "--sliding-window", "half"); err == nil || !strings.Contains(err.Error(), "--sliding-window") {
		t.Errorf("plan --sliding-window half: %v, want an error naming the flag", err)
	}
	out := mustRun(t, "plan", "--model", "gemma-2-9b", "--avg-context", "8192", "--sliding-window", "window")
	for _, want := range []string{"21 of the 42 layers attend to their last 4096 tokens", "256 (its last 4096 tokens) of the 21 sliding-window layers",
		"per block (21 sliding-window layers)", "2113929216"} {
		if !strings.Contains(out, want) {
			t.Errorf("plan table lacks %q:\n%s", want, out)
		}
	}
}

func cmpOr(a, b string) string {
	if a != "" {
		return a
	}
	return b
}

// The config.json rules: layer_types wins, else the model type's rule;
// an unknown model type, an absent, null or 0 window, or use_sliding_window
// false is no sliding-window layer.
func TestParseHFConfigSliding(t *testing.T) {
	base := `"num_hidden_layers":%d,"num_attention_heads":4,"num_key_value_heads":2,"head_dim":64`
	cfg := func(layers int, rest string) string {
		return "{" + fmt.Sprintf(base, layers) + rest + "}"
	}
	types := func(ts ...string) string { return `,"layer_types":["` + strings.Join(ts, `","`) + `"]` }
	tests := []struct {
		name, json      string
		sliding, window int
		wantErr         string
	}{
		{"gemma2", gemma2Config, 21, 4096, ""},
		{"gemma2 odd layers: the even ones", cfg(5, `,"model_type":"gemma2","sliding_window":4096`), 3, 4096, ""},
		{"gemma2 null window", cfg(42, `,"model_type":"gemma2","sliding_window":null`), 0, 0, ""},
		{"gemma2 no window", cfg(42, `,"model_type":"gemma2"`), 0, 0, ""},
		{"gemma2 window 0", cfg(42, `,"model_type":"gemma2","sliding_window":0`), 0, 0, ""},
		{"gemma3 pattern", gemma3Config, 22, 512, ""},
		{"gemma3 pattern 1: all global", cfg(26, `,"model_type":"gemma3_text","sliding_window":512,"sliding_window_pattern":1`), 0, 0, ""},
		{"gemma3 default pattern 6", cfg(12, `,"model_type":"gemma3_text","sliding_window":1024`), 10, 1024, ""},
		{"gemma3 multimodal", `{"model_type":"gemma3","text_config":{"model_type":"gemma3_text","num_hidden_layers":62,
			"num_attention_heads":32,"num_key_value_heads":16,"head_dim":128,"sliding_window":1024}}`, 52, 1024, ""},
		{"gemma3 pattern 0", cfg(26, `,"model_type":"gemma3_text","sliding_window":512,"sliding_window_pattern":0`), 0, 0, "sliding_window_pattern"},
		{"layer_types win over the pattern", cfg(4, `,"model_type":"gemma3_text","sliding_window":512`+
			types("sliding_attention", "full_attention", "sliding_attention", "full_attention")), 2, 512, ""},
		{"gpt-oss layer_types", gptOSSConfig, 12, 128, ""},
		{"gpt-oss without layer_types", cfg(24, `,"model_type":"gpt_oss","sliding_window":128`), 12, 128, ""},
		{"layer_types of any model type", cfg(3, `,"model_type":"new_model","sliding_window":256`+
			types("sliding_attention", "sliding_attention", "full_attention")), 2, 256, ""},
		{"other layer types count as full", cfg(3, `,"sliding_window":256`+
			types("chunked_attention", "linear_attention", "sliding_attention")), 1, 256, ""},
		{"layer_types without a window", cfg(2, types("sliding_attention", "full_attention")), 0, 0, ""},
		{"layer_types too short", cfg(3, `,"sliding_window":256`+types("sliding_attention")), 0, 0, "layer_types: 1 entries for 3 layers"},
		{"qwen2 use_sliding_window false", qwen2Config, 0, 0, ""},
		{"qwen2 no use_sliding_window", cfg(28, `,"model_type":"qwen2","sliding_window":4096,"max_window_layers":20`), 0, 0, ""},
		{"qwen2 top 8 of 28", cfg(28, `,"model_type":"qwen2","sliding_window":4096,"max_window_layers":20,"use_sliding_window":true`), 8, 4096, ""},
		{"qwen2 max_window_layers above the layers", cfg(28, `,"model_type":"qwen2","sliding_window":4096,"max_window_layers":70,"use_sliding_window":true`), 0, 0, ""},
		{"qwen2 without max_window_layers", cfg(28, `,"model_type":"qwen2","sliding_window":4096,"use_sliding_window":true`), 0, 0, ""},
		{"qwen2 negative max_window_layers", cfg(28, `,"model_type":"qwen2","sliding_window":4096,"max_window_layers":-1,"use_sliding_window":true`), 0, 0, "max_window_layers"},
		{"use_sliding_window false beats layer_types", cfg(2, `,"model_type":"qwen2","sliding_window":4096,"use_sliding_window":false`+
			types("sliding_attention", "sliding_attention")), 0, 0, ""},
		{"mistral v0.1", mistral01Config, 32, 4096, ""},
		{"mistral v0.2: null", cfg(32, `,"model_type":"mistral","sliding_window":null`), 0, 0, ""},
		{"unknown model type: full", cfg(32, `,"model_type":"phi3","sliding_window":2047`), 0, 0, ""},
		{"negative window", cfg(32, `,"model_type":"mistral","sliding_window":-1`), 0, 0, "sliding_window: -1"},
		{"MLA keeps the window", `{"model_type":"mistral","num_hidden_layers":4,"kv_lora_rank":512,"qk_rope_head_dim":64,"sliding_window":64}`, 4, 64, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			m, err := parseHFConfig([]byte(tt.json), "dir")
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("error = %v, want one containing %q", err, tt.wantErr)
				}
				return
			}
			if err != nil || m.SlidingLayers != tt.sliding || m.SlidingWindow != tt.window {
				t.Fatalf("parseHFConfig = %+v, %v; want %d sliding layers over %d tokens", m, err, tt.sliding, tt.window)
			}
		})
	}
	// A spec the planner is handed (a preset) is checked too.
	ok := planInput{Model: preset(t, "gemma-2-9b"), DType: "bf16", TP: 1, TokensPerBlock: 16, Concurrency: 1, AvgContext: 1}
	for _, c := range []struct {
		mod  func(*planInput)
		want string
	}{
		{func(in *planInput) { in.Model.SlidingLayers = 43 }, "43 sliding-window layers of 42"},
		{func(in *planInput) { in.Model.SlidingLayers = -1 }, "sliding-window layers"},
		{func(in *planInput) { in.Model.SlidingWindow = 0 }, "sliding window"},
		{func(in *planInput) { in.SlidingMode = "some" }, "--sliding-window"},
	} {
		in := ok
		c.mod(&in)
		if _, err := computePlan(in); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("computePlan: %v, want an error containing %q", err, c.want)
		}
	}
}

// Two block sizes in one slab allocator: the planned blocks, put into a
// real tiers.Host in the request's mix, fit and leave the tier at rest
// (at or under its high watermark, not full) — the count is a lower bound.
// Gemma 3 1B at 4096 tokens in window mode: 256 blocks of 65536 B and 32
// of 360448 B a request. 256 MiB of 16 MiB slabs: a 360448 B block takes
// 16 MiB / 46 rounded up = 364723 B; a request 256 x 65536 + 32 x 364723 =
// 28448352 B of 256 MiB - 32 MiB: 2113 and 264 blocks. At 0.95 above NVMe
// the room is floor(0.95 x 256 MiB) - 32 MiB = 221459251 B: 1992 and 249.
func TestPlanWindowMixedBlocksFit(t *testing.T) {
	m := modelSpec{Name: "gemma-3-1b", Layers: 26, KVHeads: 1, HeadDim: 256, SlidingLayers: 22, SlidingWindow: 512}
	for _, c := range []struct {
		nvme         uint64
		high         float64
		small, large uint64
	}{{0, 0, 2113, 264}, {64 * gib, 0.95, 1992, 249}} {
		r, err := computePlan(planInput{Model: m, DType: "bf16", TP: 1, TokensPerBlock: 16, Concurrency: 100, AvgContext: 4096,
			HostBytes: 256 * mib, SlabBytes: 16 * mib, NVMeBytes: c.nvme, SlidingMode: slidingWindow})
		if err != nil {
			t.Fatal(err)
		}
		h := r.Tiers[0]
		if h.BlocksFit != c.small+c.large || h.UsableBytes != c.small*65536+c.large*360448 {
			t.Errorf("high %v: host tier %d blocks, %d B; want %d + %d", c.high, h.BlocksFit, h.UsableBytes, c.small, c.large)
		}
		host, err := tiers.NewHost(make([]byte, 256*mib), tiers.HostConfig{SlabBytes: 16 << 20, NoEvict: true})
		if err != nil {
			t.Fatal(err)
		}
		var i uint64
		put := func(size int64) {
			i++
			hd, err := host.Reserve(tiers.Key{NS: 1, Hash: shm.Hash{Lo: i}}, size)
			if err == nil {
				err = host.Commit(hd)
			}
			if errors.Is(err, tiers.ErrFull) || err != nil {
				t.Fatalf("high %v: block %d (%d B): %v", c.high, i, size, err)
			}
		}
		// Interleaved as requests store them: 8 small blocks a large one.
		for s, l := uint64(0), uint64(0); s < c.small || l < c.large; {
			if s < c.small {
				s++
				put(65536)
			}
			if l < c.large && (s >= c.small || s%8 == 0) {
				l++
				put(360448)
			}
		}
		if used, capa := host.Occupied(); c.high > 0 && (float64(used) > c.high*float64(capa) || used >= capa) {
			t.Errorf("the planned blocks occupy %d of %d B: above the high watermark %v", used, capa, c.high)
		}
	}
}
