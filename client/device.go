package client

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/kvtier/kvtier/cudaipc"
	"github.com/kvtier/kvtier/shm"
)

// ErrNoDevice: a device call on a client opened without a GPU.
var ErrNoDevice = errors.New("kvtier: client has no GPU (Options.Device or Options.GPU)")

// openGPU opens the GPU named by an ordinal or a UUID string.
func openGPU(name string) (cudaipc.Device, error) {
	devs, err := cudaipc.Devices()
	if err != nil {
		return nil, fmt.Errorf("open GPU %q: %w", name, err)
	}
	var pick cudaipc.Device
	ord, oerr := strconv.Atoi(name)
	for _, d := range devs {
		info := d.Info()
		if pick == nil && ((oerr == nil && info.Ordinal == ord) || strings.EqualFold(info.UUID.String(), name)) {
			pick = d
			continue
		}
		d.Close()
	}
	if pick == nil {
		return nil, fmt.Errorf("open GPU %q: no such device", name)
	}
	return pick, nil
}

// openGPU receives the daemon's arena on this client's GPU (the message
// after a Welcome with WelcomeFlagGPU), maps it, and registers the host arena
// as pinned.
func (cn *conn) openGPU(ctx context.Context) error {
	dev := cn.s.c.dev
	if dev == nil {
		return fmt.Errorf("%w: daemon sent a GPU arena to a client without a GPU", shm.ErrMalformed)
	}
	dl := time.Now().Add(cn.s.c.opts.DialTimeout)
	if d, ok := ctx.Deadline(); ok && d.Before(dl) {
		dl = d
	}
	cn.sock.SetDeadline(dl)
	defer cn.sock.SetDeadline(time.Time{})
	buf := make([]byte, 4096)
	raw, _, err := shm.RecvMsg(cn.sock, buf, 0)
	if err != nil {
		return fmt.Errorf("%w: gpu arena: %v", ErrDisconnected, err)
	}
	t, _, payload, err := shm.DecodeMsg(raw)
	if err != nil {
		return err
	}
	if t != shm.MsgGPUArena {
		return fmt.Errorf("%w: expected gpu arena, got message type %d", shm.ErrMalformed, t)
	}
	ga, err := shm.DecodeGPUArena(payload)
	if err != nil {
		return err
	}
	if cudaipc.UUID(ga.UUID) != dev.Info().UUID {
		return fmt.Errorf("%w: gpu arena of %s, this client is on %s", shm.ErrMalformed, cudaipc.UUID(ga.UUID), dev.Info().UUID)
	}
	m, err := dev.OpenIPC(cudaipc.IPCHandle(ga.Handle))
	if err != nil {
		return fmt.Errorf("open the daemon's GPU arena: %w", err)
	}
	if uint64(m.Size()) < ga.Size {
		m.Close()
		return fmt.Errorf("%w: gpu arena maps %d bytes, daemon announced %d", shm.ErrMalformed, m.Size(), ga.Size)
	}
	cn.gpu, cn.gpuSize = m, ga.Size
	// Pinned host memory makes D2H/H2D copies of host slots DMA at full
	// speed; without it they still work, staged by the driver.
	cn.hostPinned = dev.RegisterHost(cn.mem) == nil
	return nil
}

// closeGPU undoes openGPU (the last user of the mappings is gone).
func (cn *conn) closeGPU() {
	if cn.hostPinned {
		cn.s.c.dev.UnregisterHost(cn.mem)
		cn.hostPinned = false
	}
	if cn.gpu != nil {
		cn.gpu.Close()
		cn.gpu = nil
	}
}

// devSlot returns the device address of a completion's GPU slot, checked
// against the mapped arena.
func (cn *conn) devSlot(c *shm.CQE) (cudaipc.DevicePtr, error) {
	if cn.gpu == nil {
		return 0, fmt.Errorf("%w: daemon returned a GPU slot without a GPU arena", shm.ErrMalformed)
	}
	if err := shm.CheckSlot(c.Offset, cn.welcome.BlockBytes, cn.gpuSize); err != nil {
		return 0, err
	}
	return cn.gpu.Ptr() + cudaipc.DevicePtr(c.Offset), nil
}

// waitStream records an event on stream and waits for it: the copies queued
// before, not the whole device.
func waitStream(dev cudaipc.Device, stream cudaipc.Stream) error {
	ev, err := dev.NewEvent()
	if err != nil {
		return err
	}
	defer ev.Close()
	if err := ev.Record(stream); err != nil {
		return err
	}
	return ev.Synchronize()
}

// PutFromDevice stores the block at src (device memory of this client's
// GPU, BlockBytes long) under h. The daemon assigns a slot in its arena on
// this GPU when it has room (a D2D copy through the IPC mapping), else a host
// slot (a D2H copy into the pinned host arena). The copy is queued on stream;
// PutFromDevice waits for an event recorded after it (not for the device)
// and then commits. stored is false when the block was already cached.
func (s *Session) PutFromDevice(ctx context.Context, h Hash, src cudaipc.DevicePtr, stream cudaipc.Stream) (stored bool, err error) {
	dev := s.c.dev
	if dev == nil {
		return false, ErrNoDevice
	}
	cn, err := s.conn(ctx)
	if err != nil {
		return false, err
	}
	var out [1]shm.CQE
	if err := cn.submit(ctx, []shm.SQE{{Op: shm.OpReserve, Flags: shm.SQEFlagDevice, Hash: h}}, out[:]); err != nil {
		return false, fmt.Errorf("reserve: %w", err)
	}
	switch out[0].Status {
	case shm.StatusOK:
	case shm.StatusExists:
		return false, nil
	default:
		return false, fmt.Errorf("reserve %s: %w", h, statusErr(out[0].Status))
	}
	cn.ref()
	r := &Reservation{Hash: h, cn: cn, token: out[0].Value}
	n := int64(s.ns.BlockBytes)
	if out[0].Tier == shm.TierGPU {
		var dst cudaipc.DevicePtr
		if dst, err = cn.devSlot(&out[0]); err == nil {
			err = dev.CopyDtoDAsync(dst, src, n, stream)
		}
	} else {
		var buf []byte
		if buf, err = cn.slot(&out[0]); err == nil {
			err = dev.CopyDtoHAsync(buf, src, stream)
		}
	}
	if err == nil {
		err = waitStream(dev, stream)
	}
	if err != nil {
		r.Abort(ctx)
		return false, fmt.Errorf("put %s from device: %w", h, err)
	}
	if err := r.Commit(ctx); err != nil {
		return false, err
	}
	return true, nil
}

// GetToDevice copies the cached block h into dst (device memory of this
// client's GPU): D2D from the daemon's arena on this GPU when the block is
// (or is brought, by promotion or migration from another GPU) there, else
// H2D from the pinned host arena. The copy is queued on stream and
// GetToDevice returns once it is queued: work queued on stream afterwards
// sees the block. The lease is released when an event recorded after the
// copy completes. ErrNotFound on a miss.
func (s *Session) GetToDevice(ctx context.Context, h Hash, dst cudaipc.DevicePtr, stream cudaipc.Stream) (Tier, error) {
	dev := s.c.dev
	if dev == nil {
		return shm.TierNone, ErrNoDevice
	}
	ls, err := s.acquireBatchDev(ctx, h)
	if err != nil {
		return shm.TierNone, err
	}
	l, c := ls.l, ls.cqe
	n := int64(s.ns.BlockBytes)
	if l.Tier == shm.TierGPU {
		var p cudaipc.DevicePtr
		if p, err = l.cn.devSlot(&c); err == nil {
			err = dev.CopyDtoDAsync(dst, p, n, stream)
		}
	} else {
		err = dev.CopyHtoDAsync(dst, l.buf, stream)
	}
	var ev cudaipc.Event
	if err == nil {
		if ev, err = dev.NewEvent(); err == nil {
			if err = ev.Record(stream); err != nil {
				ev.Close()
			}
		}
	}
	if err != nil {
		stream.Synchronize() // the lease must outlive any queued copy
		l.Release()
		return shm.TierNone, fmt.Errorf("get %s to device: %w", h, err)
	}
	go func() {
		ev.Synchronize()
		ev.Close()
		l.Release()
	}()
	return l.Tier, nil
}

type devLease struct {
	l   *Lease
	cqe shm.CQE
}

func (s *Session) acquireBatchDev(ctx context.Context, h Hash) (devLease, error) {
	cn, err := s.conn(ctx)
	if err != nil {
		return devLease{}, err
	}
	var out [1]shm.CQE
	if err := cn.submit(ctx, []shm.SQE{{Op: shm.OpAcquire, Flags: shm.SQEFlagDevice, Hash: h}}, out[:]); err != nil {
		return devLease{}, fmt.Errorf("acquire: %w", err)
	}
	c := out[0]
	switch c.Status {
	case shm.StatusOK:
	case shm.StatusNotFound:
		return devLease{}, ErrNotFound
	default:
		return devLease{}, fmt.Errorf("acquire %s: %w", h, statusErr(c.Status))
	}
	l := &Lease{Hash: h, Tier: c.Tier, Promoted: c.Flags&shm.CQEFlagPromoted != 0, cn: cn, token: c.Value}
	if c.Tier != shm.TierGPU {
		if l.buf, err = cn.slot(&c); err != nil {
			cn.kill(err)
			return devLease{}, err
		}
	} else if _, err := cn.devSlot(&c); err != nil {
		cn.kill(err)
		return devLease{}, err
	}
	cn.ref()
	return devLease{l: l, cqe: c}, nil
}
