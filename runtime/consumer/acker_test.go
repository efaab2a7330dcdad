package consumer

import (
	"fmt"
	"testing"

	"github.com/stretchr/testify/require"
)

type ackCall struct {
	tag      uint64
	multiple bool
}

type fakeChannel struct{ calls []ackCall }

func (f *fakeChannel) Ack(tag uint64, multiple bool) error {
	f.calls = append(f.calls, ackCall{tag, multiple})
	return nil
}

func TestAckerUsesMultipleOnlyWhenSafe(t *testing.T) {
	t.Parallel()

	ch := &fakeChannel{}
	a := newAcker(ch)
	for tag := uint64(1); tag <= 7; tag++ {
		a.add(tag)
	}

	// Tags 1 and 2 are held by another worker: acking 3..5 with multiple
	// would acknowledge them too.
	require.NoError(t, a.ack([]uint64{5, 3, 4}))
	require.Equal(t, []ackCall{{3, false}, {4, false}, {5, false}}, ch.calls)

	// 1 and 2 are the lowest outstanding tags: one multiple-ack covers both.
	ch.calls = nil
	require.NoError(t, a.ack([]uint64{2, 1}))
	require.Equal(t, []ackCall{{2, true}}, ch.calls)

	// A single delivery is acked alone.
	ch.calls = nil
	require.NoError(t, a.ack([]uint64{7}))
	require.Equal(t, []ackCall{{7, false}}, ch.calls)

	// 6 is still outstanding; 8 and 9 come after it.
	a.add(8)
	a.add(9)
	ch.calls = nil
	require.NoError(t, a.ack([]uint64{8, 9}))
	require.Equal(t, []ackCall{{8, false}, {9, false}}, ch.calls)

	ch.calls = nil
	require.NoError(t, a.ack(nil))
	require.Empty(t, ch.calls)
}

func TestAckerRefusesAfterClose(t *testing.T) {
	t.Parallel()

	ch := &fakeChannel{}
	a := newAcker(ch)
	a.add(1)
	a.close()
	require.ErrorIs(t, a.ack([]uint64{1}), errAckerClosed)
	require.Empty(t, ch.calls)
}

func TestTruncate(t *testing.T) {
	t.Parallel()

	require.Equal(t, "short", truncate("short", 10))
	got := truncate("ääääääää", 9) // 2 bytes per rune
	require.LessOrEqual(t, len(got), 9)
	require.Equal(t, "äää…", got)
}

func TestText(t *testing.T) {
	t.Parallel()

	require.Equal(t, "a\uFFFDb\uFFFD", text("a\x00b\xff"))
}

func TestJSONValue(t *testing.T) {
	t.Parallel()

	v := jsonValue(map[string]any{
		"s":   "x\x00",
		"b":   []byte("ok"),
		"bin": []byte{0xff},
		"n":   []any{int32(1), fmt.Errorf("e")},
	})
	m := v.(map[string]any)
	require.Equal(t, "x\uFFFD", m["s"])
	require.Equal(t, "ok", m["b"])
	require.Equal(t, []byte{0xff}, m["bin"])
	require.Equal(t, []any{int32(1), "e"}, m["n"])
}
