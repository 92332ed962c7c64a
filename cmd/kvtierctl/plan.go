package main

import (
	"cmp"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"math/bits"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"text/tabwriter"

	"github.com/dustin/go-humanize"
	"github.com/spf13/cobra"

	"github.com/kvtier/kvtier/tiers/nvme"
)

// modelSpec is the part of a model's architecture that sizes its KV cache.
// A model with KVLoraRank > 0 uses multi-head latent attention (MLA): per
// token and layer it caches one compressed latent of KVLoraRank +
// QKRopeHeadDim elements instead of per-head K and V. SlidingLayers of the
// Layers attend to the last SlidingWindow tokens only (local attention):
// an engine may drop their older KV, which --sliding-window window sizes.
type modelSpec struct {
	Name          string `json:"name"`
	Layers        int    `json:"layers"`
	KVHeads       int    `json:"kv_heads,omitempty"`
	HeadDim       int    `json:"head_dim,omitempty"`
	KVLoraRank    int    `json:"kv_lora_rank,omitempty"`
	QKRopeHeadDim int    `json:"qk_rope_head_dim,omitempty"`
	SlidingLayers int    `json:"sliding_layers,omitempty"`
	SlidingWindow int    `json:"sliding_window,omitempty"` // tokens
}

func (m modelSpec) mla() bool { return m.KVLoraRank > 0 }

// modelPresets are popular models, from their Hugging Face config.json.
// qwen2.5-7b's sliding_window is unused (use_sliding_window false) and
// mixtral-8x7b's is null: full attention. mistral-7b's figures are those of
// v0.1, v0.2 and v0.3 alike, and only v0.1 has a window (4096; null
// since): kept full, which never undersizes. gemma-2-9b's even layers, 21
// of 42, are local over 4096 tokens.
var modelPresets = map[string]modelSpec{
	"llama-3-8b":   {Layers: 32, KVHeads: 8, HeadDim: 128},
	"llama-3-70b":  {Layers: 80, KVHeads: 8, HeadDim: 128},
	"qwen2.5-7b":   {Layers: 28, KVHeads: 4, HeadDim: 128},
	"mistral-7b":   {Layers: 32, KVHeads: 8, HeadDim: 128},
	"mixtral-8x7b": {Layers: 32, KVHeads: 8, HeadDim: 128},
	"deepseek-v3":  {Layers: 61, KVLoraRank: 512, QKRopeHeadDim: 64},
	"gemma-2-9b":   {Layers: 42, KVHeads: 8, HeadDim: 256, SlidingLayers: 21, SlidingWindow: 4096},
}

func presetNames() []string {
	names := make([]string, 0, len(modelPresets))
	for n := range modelPresets {
		names = append(names, n)
	}
	slices.Sort(names)
	return names
}

func presetModel(name string) (modelSpec, error) {
	m, ok := modelPresets[strings.ToLower(name)]
	if !ok {
		return modelSpec{}, fmt.Errorf("plan: unknown model %q (presets: %s; or give --hf-config)", name, strings.Join(presetNames(), ", "))
	}
	m.Name = strings.ToLower(name)
	return m, nil
}

// hfConfig is the subset of a Hugging Face config.json that sizes the KV
// cache. Pointers tell absent (or null) fields from zeros.
type hfConfig struct {
	NameOrPath        string `json:"_name_or_path"`
	ModelType         string `json:"model_type"`
	NumHiddenLayers   *int   `json:"num_hidden_layers"`
	NumAttentionHeads *int   `json:"num_attention_heads"`
	NumKeyValueHeads  *int   `json:"num_key_value_heads"`
	HeadDim           *int   `json:"head_dim"`
	HiddenSize        *int   `json:"hidden_size"`
	KVLoraRank        *int   `json:"kv_lora_rank"`
	QKRopeHeadDim     *int   `json:"qk_rope_head_dim"`
	// Sliding-window attention (slidingLayers reads them).
	SlidingWindow        *int     `json:"sliding_window"`
	SlidingWindowPattern *int     `json:"sliding_window_pattern"`
	UseSlidingWindow     *bool    `json:"use_sliding_window"`
	MaxWindowLayers      *int     `json:"max_window_layers"`
	LayerTypes           []string `json:"layer_types"`
	// Multimodal models (Llava, Gemma 3, ...) nest the language model.
	TextConfig *hfConfig `json:"text_config"`
}

func ptr(v int) *int { return &v }

// hfClassDefaults are the transformers config classes' defaults of the
// fields that size the KV cache, for the model types whose defaults differ
// from the generic fallbacks (num_key_value_heads = num_attention_heads,
// head_dim = hidden_size / num_attention_heads). Only the values every
// transformers release agrees on: Gemma's head_dim is 256 in all of them,
// Gemma 3's sliding_window_pattern 6 (4.53 on keeps it as the default of
// layer_types). Not sliding_window: an absent window is taken as none.
var hfClassDefaults = map[string]hfConfig{
	"gemma":  {HeadDim: ptr(256)},
	"gemma2": {HeadDim: ptr(256)},
	"gemma3_text": {NumHiddenLayers: ptr(26), NumAttentionHeads: ptr(8), NumKeyValueHeads: ptr(4), HeadDim: ptr(256),
		SlidingWindowPattern: ptr(6)},
}

func val(p *int) int {
	if p == nil {
		return 0
	}
	return *p
}

// parseHFConfig derives a modelSpec from the bytes of a config.json.
func parseHFConfig(data []byte, name string) (modelSpec, error) {
	var c hfConfig
	if err := json.Unmarshal(data, &c); err != nil {
		return modelSpec{}, fmt.Errorf("not a JSON object: %w", err)
	}
	if c.NumHiddenLayers == nil && c.TextConfig != nil {
		tc := *c.TextConfig
		if tc.NameOrPath == "" {
			tc.NameOrPath = c.NameOrPath
		}
		c = tc
	}
	// transformers reads an absent field as the model class's default, and
	// writes a multimodal model's text_config as a diff against those
	// defaults (Gemma 3 12B's omits head_dim 256, which hidden_size /
	// num_attention_heads = 240 is not).
	if d, ok := hfClassDefaults[c.ModelType]; ok {
		c.NumHiddenLayers = cmp.Or(c.NumHiddenLayers, d.NumHiddenLayers)
		c.NumAttentionHeads = cmp.Or(c.NumAttentionHeads, d.NumAttentionHeads)
		c.NumKeyValueHeads = cmp.Or(c.NumKeyValueHeads, d.NumKeyValueHeads)
		c.HeadDim = cmp.Or(c.HeadDim, d.HeadDim)
		c.SlidingWindowPattern = cmp.Or(c.SlidingWindowPattern, d.SlidingWindowPattern)
	}
	m := modelSpec{Name: name}
	if c.NameOrPath != "" {
		m.Name = c.NameOrPath
	}
	if m.Layers = val(c.NumHiddenLayers); m.Layers <= 0 {
		return modelSpec{}, errors.New("num_hidden_layers: missing or not positive")
	}
	var err error
	if m.SlidingLayers, m.SlidingWindow, err = slidingLayers(c, m.Layers); err != nil {
		return modelSpec{}, err
	}
	if lora := val(c.KVLoraRank); lora > 0 {
		m.KVLoraRank = lora
		if m.QKRopeHeadDim = val(c.QKRopeHeadDim); m.QKRopeHeadDim < 0 {
			return modelSpec{}, errors.New("qk_rope_head_dim: negative")
		}
		return m, nil
	}
	heads := val(c.NumAttentionHeads)
	m.KVHeads = val(c.NumKeyValueHeads)
	if c.NumKeyValueHeads == nil {
		m.KVHeads = heads // MHA: every attention head has its own K/V
	}
	if m.KVHeads <= 0 {
		return modelSpec{}, errors.New("num_key_value_heads (or num_attention_heads): missing or not positive")
	}
	m.HeadDim = val(c.HeadDim)
	if c.HeadDim == nil {
		if heads <= 0 || val(c.HiddenSize) <= 0 {
			return modelSpec{}, errors.New("head_dim: missing, and hidden_size / num_attention_heads cannot stand in for it")
		}
		if val(c.HiddenSize)%heads != 0 {
			return modelSpec{}, fmt.Errorf("head_dim: missing, and hidden_size %d is not a multiple of num_attention_heads %d", val(c.HiddenSize), heads)
		}
		m.HeadDim = val(c.HiddenSize) / heads
	}
	if m.HeadDim <= 0 {
		return modelSpec{}, errors.New("head_dim: not positive")
	}
	return m, nil
}

// slidingLayers is how many of a config's layers use sliding-window
// attention, and over how many tokens. layer_types, which transformers
// 4.53 on writes for every model with such layers, wins; without it the
// model types whose rule is known: Gemma 2 and gpt-oss alternate (the
// even-indexed layers local), Gemma 3 has sliding_window_pattern - 1 local
// layers before each global one, Mistral (7B v0.1) windows every layer,
// and Qwen2 with use_sliding_window all but the max_window_layers bottom
// ones. Any other model type, and any layer type but sliding_attention
// (chunked, linear, ...), counts as full attention: an overestimate, never
// an undersized cache. A window that is absent, null or 0, or that
// use_sliding_window false disables (Qwen2 writes one it does not use), is
// none.
func slidingLayers(c hfConfig, layers int) (n, window int, err error) {
	switch window = val(c.SlidingWindow); {
	case window < 0:
		return 0, 0, fmt.Errorf("sliding_window: %d is negative", window)
	case window == 0, c.UseSlidingWindow != nil && !*c.UseSlidingWindow:
		return 0, 0, nil
	}
	switch {
	case c.LayerTypes != nil:
		if len(c.LayerTypes) != layers {
			return 0, 0, fmt.Errorf("layer_types: %d entries for %d layers", len(c.LayerTypes), layers)
		}
		for _, t := range c.LayerTypes {
			if t == "sliding_attention" {
				n++
			}
		}
	case c.ModelType == "gemma2" || c.ModelType == "gpt_oss":
		n = (layers + 1) / 2
	case c.ModelType == "gemma3_text":
		p := val(c.SlidingWindowPattern)
		if p <= 0 {
			return 0, 0, fmt.Errorf("sliding_window_pattern: %d is not positive", p)
		}
		n = layers - layers/p // layer i is global where (i+1) % p == 0
	case c.ModelType == "mistral":
		n = layers
	case c.ModelType == "qwen2" && c.UseSlidingWindow != nil: // true: false returned above
		// Without max_window_layers the split is a guess: none.
		bottom := val(c.MaxWindowLayers)
		if bottom < 0 {
			return 0, 0, fmt.Errorf("max_window_layers: %d is negative", bottom)
		}
		if c.MaxWindowLayers != nil {
			n = max(layers-bottom, 0)
		}
	}
	if n == 0 {
		return 0, 0, nil
	}
	return n, window, nil
}

// maxHFConfigBytes bounds what plan reads of --hf-config: a config.json is
// kilobytes, and a weights file or a device given by mistake must not be
// read into memory whole.
const maxHFConfigBytes = 16 << 20

func loadHFConfig(path string) (modelSpec, error) {
	f, err := os.Open(path)
	if err != nil {
		return modelSpec{}, fmt.Errorf("plan: %w", err)
	}
	defer f.Close()
	data, err := io.ReadAll(io.LimitReader(f, maxHFConfigBytes+1))
	switch {
	case err != nil:
		return modelSpec{}, fmt.Errorf("plan: %w", err)
	case len(data) > maxHFConfigBytes:
		return modelSpec{}, fmt.Errorf("plan: %s: larger than %s, not a config.json", path, humanize.IBytes(maxHFConfigBytes))
	}
	// A config.json is named after its directory (the model's repo).
	name := filepath.Base(filepath.Dir(path))
	if name == "." || name == string(filepath.Separator) {
		name = filepath.Base(path)
	}
	m, err := parseHFConfig(data, name)
	if err != nil {
		return modelSpec{}, fmt.Errorf("plan: %s: %w", path, err)
	}
	return m, nil
}

// kvDTypeBits is the storage width of one KV element.
var kvDTypeBits = map[string]int{
	"fp32": 32, "fp16": 16, "bf16": 16,
	"fp8": 8, "fp8_e4m3": 8, "fp8_e5m2": 8, "int8": 8, "int4": 4,
}

// quantScaleBytes is the size of one per-group scale (fp16).
const quantScaleBytes = 2

// planInput is everything the planner's arithmetic depends on.
type planInput struct {
	Model          modelSpec
	DType          string
	QuantGroup     int // elements per scale; 0: no per-group scales
	TP             int
	TokensPerBlock int
	Concurrency    int
	AvgContext     int
	// Tier capacities in bytes; 0 means the tier is absent. GPU is per GPU
	// (the planner multiplies it by TP); host and NVMe are per host.
	GPUBytes, HostBytes, NVMeBytes uint64
	TierSource                     string
	// SlabBytes is the host tier's slab size (the daemon's
	// host.slab_bytes); 0 means its default.
	SlabBytes uint64
	// HostHigh and GPUHigh are the tiers' high watermarks (host and gpu
	// .high_watermark); 0 means the daemon's default. A tier that has a
	// tier below to demote to keeps at most this share of its capacity:
	// a working set above it is demoted down to the low watermark, again
	// and again. The host tier has one only above an NVMe tier.
	HostHigh, GPUHigh float64
	// SlidingMode is --sliding-window: slidingFull ("" too) or
	// slidingWindow.
	SlidingMode string
}

// --sliding-window: what an engine stores of a sliding-window layer.
const (
	// Every layer's KV for every block: an engine offloading whole
	// blocks stores it so.
	slidingFull = "full"
	// A sliding-window layer's KV only for the blocks of a request's last
	// window tokens. A daemon namespace has one block size
	// (shm.Namespace.BlockBytes; Put refuses any other), so such an
	// engine keeps two namespaces: the full-attention layers' blocks,
	// every one, and the sliding-window layers' blocks, the window's.
	slidingWindow = "window"
)

// The daemon's default high watermarks (daemon.DefaultConfig).
const (
	defaultHostHigh = 0.95
	defaultGPUHigh  = 0.9
)

// The host tier's allocator (tiers/doc.go): a slab holds
// floor(SlabBytes/stride) blocks of one size, the stride being the block
// size rounded up to hostAlign; a block larger than a slab is refused.
const (
	defaultSlabBytes = 64 << 20 // daemon: host.slab_bytes default
	hostAlign        = 4096     // daemon: the host tier's slot alignment
)

// slabKeepsBlocks is the most blocks of size block a slab allocator (the
// host tier's, or a GPU arena's) of capa bytes in slabs of slab bytes (0:
// none, each block in its own stride) keeps at rest: whole blocks per slab,
// each in a stride of block rounded up to hostAlign, and with a high
// watermark high (0: none; the host tier has one only above an NVMe tier)
// no more than its demoter leaves there. The demoters count a slab's
// space, not block bytes (tiers.Host.Occupied): a slab given to blocks of
// one size is occupied but for its free slots, its tail past the last
// whole stride included. fullIsAbove: a full tier is above any high
// watermark (the host mover's, tiers/chain.go: above; not the GPU's).
// Blocks are counted packed into as few slabs as they fit.
func slabKeepsBlocks(capa, slab, block uint64, high float64, fullIsAbove bool) uint64 {
	up := func(a, b uint64) uint64 { return a/b + min(a%b, 1) }
	stride := up(block, hostAlign) * hostAlign
	if slab == 0 {
		slab = stride
	}
	if stride == 0 || stride > slab {
		return 0
	}
	per := slab / stride
	all := capa / slab * per
	if high == 0 {
		return all
	}
	arena := capa / slab * slab
	// The space k blocks occupy, packed: their slabs but for the free
	// slots of the last.
	occupied := func(k uint64) uint64 {
		s := up(k, per)
		return s*slab - (s*per-k)*stride
	}
	keeps := func(k uint64) bool {
		o := occupied(k)
		return float64(o) <= high*float64(capa) && (o < arena || !fullIsAbove)
	}
	// occupied grows with k: the first k not kept, less one.
	return uint64(sort.Search(int(all)+1, func(k int) bool { return !keeps(uint64(k)) })) - 1
}

// blockClass is one block size of a request's blocks: perReq of them per
// request and rank.
type blockClass struct{ bytes, perReq uint64 }

// tierKeeps is what a tier keeps of the working set: its blocks, their
// bytes, and how many requests' blocks (of one rank) they make.
type tierKeeps struct{ blocks, bytes, units uint64 }

// slabTierKeeps is what a slab allocator of capa bytes in slabs of slab
// bytes keeps of blocks of the classes (see slabKeepsBlocks): exact for
// one class; for two (--sliding-window window) conservative, in a
// request's mix (mixKeeps): a block takes a slab's share,
// ceil(slab / blocks per slab), and the room is short one slab per class,
// more than the partly filled last slab of each. k_i blocks of class i
// then take fewer slabs than there are, and occupy (tiers.Host.Occupied,
// what the demoters count) less than the high watermark and the arena.
// ok is false where the sizes overflow.
func slabTierKeeps(capa, slab uint64, classes []blockClass, high float64, fullIsAbove bool) (k tierKeeps, ok bool) {
	if len(classes) == 1 {
		c := classes[0]
		n := slabKeepsBlocks(capa, slab, c.bytes, high, fullIsAbove)
		return tierKeeps{blocks: n, bytes: n * c.bytes, units: n / c.perReq}, true
	}
	space := make([]uint64, len(classes))
	for i, c := range classes {
		if c.bytes > slab {
			return tierKeeps{}, true // no slab holds these: none of the mix
		}
		per := slab / ((c.bytes + hostAlign - 1) / hostAlign * hostAlign)
		space[i] = slab/per + min(slab%per, 1)
	}
	room := capa / slab * slab
	if high > 0 {
		room = min(room, highBytes(high, capa))
	}
	if reserve := uint64(len(classes)) * slab; room > reserve {
		return mixKeeps(room-reserve, space, classes)
	}
	return tierKeeps{}, true
}

// nvmeKeeps is what an NVMe store of limit logical bytes keeps of blocks
// of the classes, each charged as the store does: its bytes padded to the
// direct-I/O alignment (nvme.PlanAlign) plus nvme.BlockOverhead; exact for
// one class, in a request's mix for two (mixKeeps).
func nvmeKeeps(limit uint64, classes []blockClass) (tierKeeps, bool) {
	space := make([]uint64, len(classes))
	for i, c := range classes {
		padded, carry := bits.Add64(c.bytes, nvme.PlanAlign-1, 0)
		padded -= padded % nvme.PlanAlign
		var c2 uint64
		if space[i], c2 = bits.Add64(padded, nvme.BlockOverhead, 0); carry|c2 != 0 {
			return tierKeeps{}, false
		}
	}
	if len(classes) == 1 {
		c, n := classes[0], limit/space[0]
		return tierKeeps{blocks: n, bytes: n * c.bytes, units: n / c.perReq}, true
	}
	return mixKeeps(limit, space, classes)
}

// mixKeeps counts blocks of several sizes in room bytes of a tier, a block
// of class i taking space[i]: the blocks of whole and partial requests in
// the request's mix (classes[i].perReq per request), so that
// sum k_i·space[i] ≤ room. Which blocks an engine puts where is its own;
// the mix is the working set's. ok is false where the sizes overflow.
func mixKeeps(room uint64, space []uint64, classes []blockClass) (k tierKeeps, ok bool) {
	var unit uint64 // the space of one request's blocks
	for i, c := range classes {
		hi, lo := bits.Mul64(c.perReq, space[i])
		var carry uint64
		if unit, carry = bits.Add64(unit, lo, 0); hi != 0 || carry != 0 {
			return tierKeeps{}, false
		}
	}
	k.units = room / unit
	for _, c := range classes {
		// room·perReq/unit ≤ room/space: the quotient fits 64 bits.
		hi, lo := bits.Mul64(room, c.perReq)
		n, _ := bits.Div64(hi, lo, unit)
		k.blocks += n
		k.bytes += n * c.bytes // at most n × its space: the sum is at most room
	}
	return k, true
}

// highBytes is high × capa in whole bytes, at most capa (the float product
// of a capacity near 2^64 rounds up to 2^64).
func highBytes(high float64, capa uint64) uint64 {
	if f := high * float64(capa); f < 0x1p64 {
		return min(uint64(f), capa)
	}
	return capa
}

// planBlockGroup is one kind of daemon block a request stores: a namespace
// of Layers layers, its blocks BlockBytes each (per rank).
type planBlockGroup struct {
	// "all" (every layer: --sliding-window full, or a model without
	// sliding-window layers), "full_attention" or "sliding_attention"
	// (--sliding-window window: the layer group's namespace).
	Attention        string `json:"attention"`
	Layers           int    `json:"layers"`
	BlockBytes       uint64 `json:"block_bytes"`
	BlocksPerRequest uint64 `json:"blocks_per_request_per_rank"`
}

// planTier is one tier of the split.
type planTier struct {
	Name          string `json:"name"`
	CapacityBytes uint64 `json:"capacity_bytes"`
	// UsableBytes is the block bytes the tier holds at most (BlocksFit
	// whole blocks): less than its capacity where the tier packs blocks
	// into slabs (host), demotes above a high watermark (GPU; host above
	// NVMe) or evicts above a logical limit (NVMe). With blocks of two
	// sizes (--sliding-window window) they are counted in a request's mix
	// of them, conservatively: see mixKeeps.
	UsableBytes uint64  `json:"usable_bytes"`
	RequestsFit uint64  `json:"requests_fit"`
	BlocksFit   uint64  `json:"blocks_fit"`
	HoldsBytes  uint64  `json:"holds_bytes"`
	HoldsShare  float64 `json:"holds_share"`
}

// planResult is the planner's answer. Per-rank figures are what one tensor
// parallel rank (one namespace of the daemon) stores; totals add up the
// ranks.
type planResult struct {
	Model          modelSpec `json:"model"`
	Attention      string    `json:"attention"` // gqa, mqa or mla
	KVDType        string    `json:"kv_dtype"`
	QuantGroup     int       `json:"quant_group,omitempty"`
	TP             int       `json:"tp"`
	KVHeadsPerRank int       `json:"kv_heads_per_rank,omitempty"`
	TokensPerBlock int       `json:"tokens_per_block"`
	Concurrency    int       `json:"concurrency"`
	AvgContext     int       `json:"avg_context"`

	// SlidingWindowMode is --sliding-window; BlockGroups the daemon
	// blocks a request stores under it, Sizing the same in words.
	SlidingWindowMode string           `json:"sliding_window_mode"`
	BlockGroups       []planBlockGroup `json:"block_groups"`
	Sizing            string           `json:"sizing"`

	// Per token and per block of context, every layer. BlockBytes is the
	// daemon block of --sliding-window full; in window mode the groups'
	// blocks add up to it.
	BytesPerTokenPerRank uint64 `json:"bytes_per_token_per_rank"`
	BytesPerToken        uint64 `json:"bytes_per_token"`
	BlockBytes           uint64 `json:"block_bytes"`
	// BlocksPerRequest is a request's blocks of context, ceil(avg_context
	// / tokens_per_block); the figures below count what BlockGroups store.
	BlocksPerRequest       uint64 `json:"blocks_per_request_per_rank"`
	BytesPerRequestPerRank uint64 `json:"bytes_per_request_per_rank"`
	BytesPerRequest        uint64 `json:"bytes_per_request"`
	TotalBytesPerRank      uint64 `json:"total_bytes_per_rank"`
	TotalBytes             uint64 `json:"total_bytes"`

	TierSource string     `json:"tier_source,omitempty"`
	Tiers      []planTier `json:"tiers,omitempty"`
	// FitsIn is the last tier the working set reaches when the tiers fill
	// in order (gpu, host, nvme); ShortBytes is what none of them holds.
	FitsIn     string `json:"fits_in,omitempty"`
	Spills     bool   `json:"spills"`
	ShortBytes uint64 `json:"short_bytes"`
}

// computePlan does the arithmetic. KV is stored in vectors: GQA/MHA caches a
// K and a V vector of head_dim elements per KV head, layer and token; MLA
// one latent of kv_lora_rank + qk_rope_head_dim elements per layer and
// token. A vector with per-group scales carries one fp16 scale per started
// group of QuantGroup elements.
func computePlan(in planInput) (planResult, error) {
	m := in.Model
	elemBits, ok := kvDTypeBits[in.DType]
	switch {
	case !ok:
		return planResult{}, fmt.Errorf("plan: --kv-dtype %q is not one of fp32, fp16, bf16, fp8, int8, int4", in.DType)
	case m.Layers <= 0:
		return planResult{}, errors.New("plan: model has no layers")
	case !m.mla() && (m.KVHeads <= 0 || m.HeadDim <= 0):
		return planResult{}, errors.New("plan: model needs positive kv heads and head dim")
	case in.QuantGroup < 0:
		return planResult{}, errors.New("plan: --quant-group must be positive")
	case in.QuantGroup > 0 && in.DType != "int4" && in.DType != "int8":
		return planResult{}, fmt.Errorf("plan: --quant-group applies to int4 and int8, not %s", in.DType)
	case in.TP <= 0:
		return planResult{}, errors.New("plan: --tp must be at least 1")
	case in.TokensPerBlock <= 0:
		return planResult{}, errors.New("plan: --tokens-per-block must be positive")
	case in.Concurrency <= 0:
		return planResult{}, errors.New("plan: --concurrency must be positive")
	case in.AvgContext <= 0:
		return planResult{}, errors.New("plan: --avg-context must be positive")
	case in.HostHigh < 0 || in.HostHigh > 1 || math.IsNaN(in.HostHigh):
		return planResult{}, fmt.Errorf("plan: --host-high-watermark must be in (0, 1], got %v", in.HostHigh)
	case in.GPUHigh < 0 || in.GPUHigh > 1 || math.IsNaN(in.GPUHigh):
		return planResult{}, fmt.Errorf("plan: --gpu-high-watermark must be in (0, 1], got %v", in.GPUHigh)
	case in.SlabBytes != 0 && (in.SlabBytes < 1<<20 || in.SlabBytes > 1<<30 || bits.OnesCount64(in.SlabBytes) != 1):
		return planResult{}, fmt.Errorf("plan: --slab-bytes must be a power of two between 1MiB and 1GiB, got %d", in.SlabBytes)
	case m.SlidingLayers < 0 || m.SlidingLayers > m.Layers:
		return planResult{}, fmt.Errorf("plan: model has %d sliding-window layers of %d", m.SlidingLayers, m.Layers)
	case m.SlidingLayers > 0 && m.SlidingWindow <= 0:
		return planResult{}, fmt.Errorf("plan: model's sliding window of %d tokens is not positive", m.SlidingWindow)
	}
	mode := cmp.Or(in.SlidingMode, slidingFull)
	if mode != slidingFull && mode != slidingWindow {
		return planResult{}, fmt.Errorf("plan: --sliding-window %q is not full or window", in.SlidingMode)
	}
	r := planResult{
		Model: m, KVDType: in.DType, QuantGroup: in.QuantGroup, TP: in.TP,
		TokensPerBlock: in.TokensPerBlock, Concurrency: in.Concurrency, AvgContext: in.AvgContext,
		SlidingWindowMode: mode,
	}

	// Model dimensions come from any config.json: every product is checked
	// (a wrapped one could make a block 0 bytes).
	tp := uint64(in.TP)
	var overflow bool
	mul := func(a, b uint64) uint64 {
		hi, lo := bits.Mul64(a, b)
		overflow = overflow || hi != 0
		return lo
	}
	add := func(a, b uint64) uint64 {
		sum, carry := bits.Add64(a, b, 0)
		overflow = overflow || carry != 0
		return sum
	}
	ceilDiv := func(a, b uint64) uint64 { return a/b + min(a%b, 1) }
	var vecElems, vecsPerLayer uint64
	if m.mla() {
		// The latent is shared by all heads: every rank keeps all of it.
		r.Attention = "mla"
		vecElems = add(uint64(m.KVLoraRank), uint64(max(m.QKRopeHeadDim, 0)))
		vecsPerLayer = 1
	} else {
		r.Attention = "gqa"
		if m.KVHeads == 1 {
			r.Attention = "mqa"
		}
		// KV heads split across ranks; with more ranks than heads each
		// head is replicated on TP/heads ranks.
		switch {
		case in.TP <= m.KVHeads && m.KVHeads%in.TP != 0:
			return planResult{}, fmt.Errorf("plan: %d KV heads do not split evenly across --tp %d", m.KVHeads, in.TP)
		case in.TP > m.KVHeads && in.TP%m.KVHeads != 0:
			return planResult{}, fmt.Errorf("plan: --tp %d is not a multiple of the %d KV heads to replicate", in.TP, m.KVHeads)
		}
		r.KVHeadsPerRank = max(1, m.KVHeads/in.TP)
		vecElems = uint64(m.HeadDim)
		vecsPerLayer = 2 * uint64(r.KVHeadsPerRank) // K and V
	}
	vecBytes := ceilDiv(mul(vecElems, uint64(elemBits)), 8)
	if g := uint64(in.QuantGroup); g > 0 {
		vecBytes = add(vecBytes, mul(ceilDiv(vecElems, g), quantScaleBytes))
	}
	tpb := uint64(in.TokensPerBlock)
	layerBlock := mul(mul(vecsPerLayer, vecBytes), tpb) // one layer's block, per rank
	r.BytesPerTokenPerRank = mul(mul(vecsPerLayer, vecBytes), uint64(m.Layers))
	r.BytesPerToken = mul(r.BytesPerTokenPerRank, tp)
	r.BlockBytes = mul(r.BytesPerTokenPerRank, tpb)
	// The cache holds whole blocks; a request's last, partial block is
	// counted whole.
	ctx := uint64(in.AvgContext)
	r.BlocksPerRequest = ceilDiv(ctx, tpb)
	group := func(attention string, layers int, blocks uint64) planBlockGroup {
		return planBlockGroup{Attention: attention, Layers: layers, BlockBytes: mul(layerBlock, uint64(layers)), BlocksPerRequest: blocks}
	}
	switch full := m.Layers - m.SlidingLayers; {
	case mode == slidingWindow && m.SlidingLayers > 0:
		// The blocks the request's last window tokens lie in: up to
		// one more than window / tokens_per_block rounded up, where
		// the request ends inside a block.
		win := r.BlocksPerRequest - (ctx-min(ctx, uint64(m.SlidingWindow)))/tpb
		if full > 0 {
			r.BlockGroups = append(r.BlockGroups, group("full_attention", full, r.BlocksPerRequest))
			r.Sizing = fmt.Sprintf("window: per request and rank, %d blocks of the %d full-attention layers and %d (its last %d tokens) of the %d sliding-window layers, a namespace each",
				r.BlocksPerRequest, full, win, m.SlidingWindow, m.SlidingLayers)
		} else {
			r.Sizing = fmt.Sprintf("window: every layer is sliding-window: per request and rank, the %d blocks of its last %d tokens", win, m.SlidingWindow)
		}
		r.BlockGroups = append(r.BlockGroups, group("sliding_attention", m.SlidingLayers, win))
	case m.SlidingLayers > 0:
		r.BlockGroups = []planBlockGroup{group("all", m.Layers, r.BlocksPerRequest)}
		r.Sizing = fmt.Sprintf("full: every block holds all %d layers, the %d sliding-window ones too (an engine offloading whole blocks; --sliding-window window keeps theirs for the last %d tokens only)",
			m.Layers, m.SlidingLayers, m.SlidingWindow)
	default:
		r.BlockGroups = []planBlockGroup{group("all", m.Layers, r.BlocksPerRequest)}
		r.Sizing = fmt.Sprintf("every block holds all %d layers (none is sliding-window)", m.Layers)
	}
	for _, g := range r.BlockGroups {
		r.BytesPerRequestPerRank = add(r.BytesPerRequestPerRank, mul(g.BlocksPerRequest, g.BlockBytes))
	}
	r.BytesPerRequest = mul(r.BytesPerRequestPerRank, tp)
	r.TotalBytesPerRank = mul(r.BytesPerRequestPerRank, uint64(in.Concurrency))
	r.TotalBytes = mul(r.BytesPerRequest, uint64(in.Concurrency))
	// A tier's allocator keeps one size class per block size: groups of
	// equal block size (Gemma 2's 21 and 21 layers) are one class.
	var classes []blockClass
	for _, g := range r.BlockGroups {
		if i := slices.IndexFunc(classes, func(c blockClass) bool { return c.bytes == g.BlockBytes }); i >= 0 {
			classes[i].perReq = add(classes[i].perReq, g.BlocksPerRequest)
		} else {
			classes = append(classes, blockClass{bytes: g.BlockBytes, perReq: g.BlocksPerRequest})
		}
	}
	gpuBytes := mul(in.GPUBytes, tp)
	if overflow {
		return planResult{}, errors.New("plan: sizes overflow 64 bits")
	}

	r.TierSource = in.TierSource
	remaining := r.TotalBytes
	slab := cmp.Or(in.SlabBytes, defaultSlabBytes)
	for _, t := range []struct {
		name string
		capa uint64
	}{{"gpu", gpuBytes}, {"host", in.HostBytes}, {"nvme", in.NVMeBytes}} {
		if t.capa == 0 {
			continue
		}
		// Where the tier demotes, what it keeps stays under its high
		// watermark (slabKeepsBlocks counts it as the demoter does).
		var high float64
		switch {
		case t.name == "gpu":
			high = cmp.Or(in.GPUHigh, defaultGPUHigh)
		case t.name == "host" && in.NVMeBytes > 0:
			high = cmp.Or(in.HostHigh, defaultHostHigh)
		}
		var k tierKeeps
		ok := true
		switch t.name {
		case "gpu":
			// Each GPU's arena is a slab allocator too, its slabs the
			// host tier's size unless gpu.slab_bytes is set. A request
			// has its blocks on every GPU.
			k, ok = slabTierKeeps(in.GPUBytes, slab, classes, high, false)
			k.blocks, k.bytes = tp*k.blocks, tp*k.bytes
		case "host":
			for _, c := range classes {
				// A slab is a multiple of hostAlign: a block no
				// larger than a slab has a stride no larger than one.
				if c.bytes > slab {
					return planResult{}, fmt.Errorf("plan: a block of %s does not fit the host tier's slabs of %s (host.slab_bytes; --slab-bytes)",
						humanize.IBytes(c.bytes), humanize.IBytes(slab))
				}
			}
			k, ok = slabTierKeeps(t.capa, slab, classes, high, true)
			k.units /= tp
		case "nvme":
			if t.capa < nvme.MinCapacity {
				return planResult{}, fmt.Errorf("plan: --nvme-bytes %s is below the NVMe tier's minimum of %s",
					humanize.IBytes(t.capa), humanize.IBytes(nvme.MinCapacity))
			}
			// The store evicts above its logical limit, not at its
			// capacity (the rest is reserve for segments, GC and the
			// index), and charges each block its bytes plus an index
			// record; the daemon takes at most MaxInt64.
			k, ok = nvmeKeeps(uint64(nvme.LogicalLimitFor(int64(min(t.capa, math.MaxInt64)))), classes)
			k.units /= tp
		}
		if !ok {
			return planResult{}, errors.New("plan: sizes overflow 64 bits")
		}
		holds := min(remaining, k.bytes)
		remaining -= holds
		pt := planTier{
			Name: t.name, CapacityBytes: t.capa, UsableBytes: k.bytes,
			RequestsFit: k.units, BlocksFit: k.blocks,
			HoldsBytes: holds, HoldsShare: float64(holds) / float64(r.TotalBytes),
		}
		if holds > 0 {
			r.FitsIn = t.name
		}
		r.Tiers = append(r.Tiers, pt)
	}
	if len(r.Tiers) > 0 {
		r.ShortBytes = remaining
		r.Spills = r.FitsIn != r.Tiers[0].Name || remaining > 0
	}
	return r, nil
}

func newPlanCmd(g *globals) *cobra.Command {
	var (
		model, hfPath, dtype string
		live                 bool
		in                   = planInput{TP: 1, TokensPerBlock: 16}
		gpu, host, nvme      capacity
		slab                 = capacity(defaultSlabBytes)
	)
	cmd := &cobra.Command{
		Use:   "plan (--model NAME | --hf-config FILE) --concurrency N --avg-context TOKENS",
		Short: "Size the KV cache of a workload and how it splits across the tiers",
		Long: `plan computes the KV-cache footprint of a model at a given concurrency and
average context, and how it splits across GPU, host and NVMe: per token (per
tensor-parallel rank and in total), per block, per request and for the whole
workload, how many requests fit in each tier, and into which tier the working
set spills when the tiers fill in order gpu → host → nvme. The NVMe tier
holds blocks up to its store's logical limit (about 90% of --nvme-bytes; the
rest is its reserve), each block charged 192 bytes of index on top. The host
tier holds whole blocks per slab (--slab-bytes, the daemon's host.slab_bytes),
each rounded up to 4KiB.

GQA/MHA models cache K and V per KV head: 2 x layers x kv_heads x head_dim
elements per token, the heads split across --tp ranks. MLA models (DeepSeek)
cache one latent of kv_lora_rank + qk_rope_head_dim elements per layer, which
every rank keeps whole. int4 is half a byte per element; --quant-group adds one
fp16 scale per group of that many elements.

Sliding-window layers (Gemma 2 and 3, gpt-oss, Mistral 7B v0.1, Qwen2 with
use_sliding_window: from a config.json's layer_types, else its model type's
rule; any other model is all full attention) attend to their last
sliding_window tokens only. --sliding-window full (the default) sizes an
engine that offloads whole blocks: every block holds every layer.
--sliding-window window sizes one that keeps a sliding-window layer's KV only
for a request's last window tokens (the blocks they lie in): as a daemon
namespace has one block size, the full-attention and the sliding-window
layers are then a namespace each, of every block and of the window's blocks
(block_groups in --json). A tier holding blocks of both sizes is counted in a
request's mix of them, one slab per size short: a lower bound.

Tier sizes come from --gpu-bytes (per GPU, times --tp), --host-bytes and
--nvme-bytes, or from the running daemon's host and NVMe tiers when --socket
or --live is given, with the daemon's slab size (explicit size flags still win).

Presets: ` + strings.Join(presetNames(), ", ") + `.`,
		Example: `  kvtierctl plan --model llama-3-8b --concurrency 64 --avg-context 8192
  kvtierctl plan --hf-config ./Qwen2.5-72B/config.json --tp 4 --kv-dtype fp8 --concurrency 32 --avg-context 32768 --gpu-bytes 40GiB --host-bytes 512GiB
  kvtierctl plan --model deepseek-v3 --concurrency 64 --avg-context 8192 --live --json`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			switch {
			case (model == "") == (hfPath == ""):
				return errors.New("plan: give exactly one of --model NAME or --hf-config FILE")
			case model != "":
				m, err := presetModel(model)
				if err != nil {
					return err
				}
				in.Model = m
			default:
				m, err := loadHFConfig(hfPath)
				if err != nil {
					return err
				}
				in.Model = m
			}
			in.DType = strings.ToLower(dtype)
			in.SlidingMode = strings.ToLower(in.SlidingMode)
			in.GPUBytes, in.HostBytes, in.NVMeBytes = uint64(gpu), uint64(host), uint64(nvme)
			if in.SlabBytes = uint64(slab); in.SlabBytes == 0 {
				return errors.New("plan: --slab-bytes must be a power of two between 1MiB and 1GiB, got 0")
			}
			if gpu > 0 || host > 0 || nvme > 0 {
				in.TierSource = "flags"
			}
			// 0 means "the default" to computePlan; given, it is wrong.
			for _, w := range []struct {
				flag string
				v    float64
			}{{"host-high-watermark", in.HostHigh}, {"gpu-high-watermark", in.GPUHigh}} {
				if !(w.v > 0 && w.v <= 1) {
					return fmt.Errorf("plan: --%s must be in (0, 1], got %v", w.flag, w.v)
				}
			}
			if live || cmd.Flags().Changed("socket") {
				ctx, cancel := g.ctx(cmd.Context())
				defer cancel()
				c, err := g.dial(ctx)
				if err != nil {
					return err
				}
				defer c.Close()
				st, err := c.Stats(ctx)
				if err != nil {
					return err
				}
				// An explicit size wins, 0 (no such tier) included.
				f := cmd.Flags()
				for _, t := range st.Tiers {
					switch {
					case t.Name == "host":
						if !f.Changed("host-bytes") {
							in.HostBytes = uint64(max(t.CapacityBytes, 0))
						}
						if t.SlabBytes > 0 && !f.Changed("slab-bytes") {
							in.SlabBytes = uint64(t.SlabBytes)
						}
						if t.HighWatermark > 0 && !f.Changed("host-high-watermark") {
							in.HostHigh = t.HighWatermark
						}
					case t.Name == "nvme" && !f.Changed("nvme-bytes"):
						in.NVMeBytes = uint64(max(t.CapacityBytes, 0))
					}
				}
				in.TierSource = "kvtierd at " + g.socket
				if f.Changed("gpu-bytes") || f.Changed("host-bytes") || f.Changed("nvme-bytes") {
					in.TierSource += " and flags"
				}
			}
			r, err := computePlan(in)
			if err != nil {
				return err
			}
			if g.json {
				return writeJSON(stdout(cmd), r)
			}
			return printPlan(stdout(cmd), r)
		},
	}
	f := cmd.Flags()
	f.StringVar(&model, "model", "", "model preset: "+strings.Join(presetNames(), ", "))
	f.StringVar(&hfPath, "hf-config", "", "Hugging Face config.json `file` of the model")
	f.IntVar(&in.Concurrency, "concurrency", 1, "concurrent requests")
	f.IntVar(&in.AvgContext, "avg-context", 4096, "average context per request, in `tokens`")
	f.StringVar(&dtype, "kv-dtype", "bf16", "KV element type: fp32, fp16, bf16, fp8, int8, int4")
	f.StringVar(&in.SlidingMode, "sliding-window", slidingFull, "what the engine stores of a sliding-window layer: full (every block) or window (the blocks of a request's last window tokens)")
	f.IntVar(&in.QuantGroup, "quant-group", 0, "int4/int8 only: `elements` per fp16 scale (0: no per-group scales)")
	f.IntVar(&in.TP, "tp", 1, "tensor parallel size (KV heads split across ranks)")
	f.IntVar(&in.TokensPerBlock, "tokens-per-block", 16, "tokens per cache block")
	f.Var(&gpu, "gpu-bytes", "KV cache `size` per GPU, e.g. 40GiB")
	f.Var(&host, "host-bytes", "host tier `size`, e.g. 256GiB")
	f.Var(&nvme, "nvme-bytes", "NVMe tier `size`, e.g. 2TiB")
	f.Var(&slab, "slab-bytes", "the daemon's host.slab_bytes (with --socket: the daemon's): the host tier (and each GPU arena, unless gpu.slab_bytes is set) holds whole blocks, each rounded up to 4KiB, per slab of this `size`")
	f.Float64Var(&in.HostHigh, "host-high-watermark", defaultHostHigh, "the daemon's host.high_watermark (with --socket: the daemon's): with an NVMe tier, the host tier keeps at most this share of its size")
	f.Float64Var(&in.GPUHigh, "gpu-high-watermark", defaultGPUHigh, "the daemon's gpu.high_watermark: a GPU arena keeps at most this share of its size")
	f.BoolVar(&live, "live", false, "take host and NVMe tier sizes from the daemon at --socket (implied by --socket)")
	return cmd
}

// capacity is a byte-size flag without an upper bound ("512GiB", "2TB").
type capacity uint64

func (c *capacity) String() string {
	if *c == 0 {
		return "0"
	}
	return humanize.IBytes(uint64(*c))
}

func (c *capacity) Set(s string) error {
	v, err := humanize.ParseBytes(s)
	if err != nil {
		return fmt.Errorf("not a size like 64GiB: %q", s)
	}
	*c = capacity(v)
	return nil
}

func (c *capacity) Type() string { return "size" }

func printPlan(w io.Writer, r planResult) error {
	m := r.Model
	switch r.Attention {
	case "mla":
		fmt.Fprintf(w, "model     %s (MLA: %d layers x latent %d + rope %d)\n", m.Name, m.Layers, m.KVLoraRank, m.QKRopeHeadDim)
	default:
		fmt.Fprintf(w, "model     %s (%s: %d layers x %d KV heads x %d dim)\n", m.Name, strings.ToUpper(r.Attention), m.Layers, m.KVHeads, m.HeadDim)
	}
	if m.SlidingLayers > 0 {
		fmt.Fprintf(w, "sliding   %d of the %d layers attend to their last %d tokens only\n", m.SlidingLayers, m.Layers, m.SlidingWindow)
	}
	dt := r.KVDType
	if r.QuantGroup > 0 {
		dt += fmt.Sprintf(" with an fp16 scale per %d elements", r.QuantGroup)
	}
	fmt.Fprintf(w, "kv dtype  %s\n", dt)
	layout := fmt.Sprintf("tp %d", r.TP)
	if r.Attention == "mla" {
		if r.TP > 1 {
			layout += " (latent replicated on every rank)"
		}
	} else {
		layout += fmt.Sprintf(" (%d KV heads per rank)", r.KVHeadsPerRank)
	}
	fmt.Fprintf(w, "layout    %s, %d tokens per block\n", layout, r.TokensPerBlock)
	fmt.Fprintf(w, "workload  %d requests x %d tokens (%d blocks per request per rank)\n", r.Concurrency, r.AvgContext, r.BlocksPerRequest)
	fmt.Fprintf(w, "stored    %s\n\n", r.Sizing)

	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "KV\tPER RANK\tTOTAL\tBYTES (TOTAL)\t")
	row := func(what string, perRank, total uint64) {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%d\t\n", what, humanize.IBytes(perRank), humanize.IBytes(total), total)
	}
	row("per token", r.BytesPerTokenPerRank, r.BytesPerToken)
	for _, g := range r.BlockGroups {
		what := "per block"
		if g.Attention != "all" {
			kind := map[string]string{"full_attention": "full-attention", "sliding_attention": "sliding-window"}[g.Attention]
			what = fmt.Sprintf("per block (%d %s layers)", g.Layers, kind)
		}
		row(what, g.BlockBytes, g.BlockBytes*uint64(r.TP))
	}
	row("per request", r.BytesPerRequestPerRank, r.BytesPerRequest)
	row("workload", r.TotalBytesPerRank, r.TotalBytes)
	if err := tw.Flush(); err != nil {
		return err
	}

	if len(r.Tiers) == 0 {
		fmt.Fprintln(w, "\nno tier sizes: give --gpu-bytes, --host-bytes, --nvme-bytes, or --socket for the daemon's")
		return nil
	}
	fmt.Fprintf(w, "\ntiers from %s, filled in order:\n", r.TierSource)
	if len(r.BlockGroups) > 1 && r.BlockGroups[0].BlockBytes != r.BlockGroups[1].BlockBytes {
		fmt.Fprintln(w, "(blocks of two sizes, counted in a request's mix with one slab per size short: a lower bound)")
	}
	tw = tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "TIER\tCAPACITY\tUSABLE\tREQUESTS FIT\tBLOCKS FIT\tHOLDS\tSHARE\t")
	for _, t := range r.Tiers {
		name := t.Name
		if t.Name == "gpu" && r.TP > 1 {
			name = fmt.Sprintf("gpu (%d x %s)", r.TP, humanize.IBytes(t.CapacityBytes/uint64(r.TP)))
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%d\t%d\t%s\t%.1f%%\t\n", name, humanize.IBytes(t.CapacityBytes),
			humanize.IBytes(t.UsableBytes), t.RequestsFit, t.BlocksFit, humanize.IBytes(t.HoldsBytes), 100*t.HoldsShare)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	switch {
	case r.ShortBytes > 0:
		fmt.Fprintf(w, "\nworking set %s does not fit: %s (%.1f%%) beyond every tier\n",
			humanize.IBytes(r.TotalBytes), humanize.IBytes(r.ShortBytes), 100*float64(r.ShortBytes)/float64(r.TotalBytes))
	case r.Spills:
		fmt.Fprintf(w, "\nworking set %s spills into %s\n", humanize.IBytes(r.TotalBytes), r.FitsIn)
	default:
		fmt.Fprintf(w, "\nworking set %s fits in %s (%.1f%% of it)\n", humanize.IBytes(r.TotalBytes), r.FitsIn,
			100*float64(r.TotalBytes)/float64(r.Tiers[0].CapacityBytes))
	}
	return nil
}
