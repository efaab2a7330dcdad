package termtext

import (
	"testing"

	"github.com/stretchr/testify/require"
)

func TestEscape(t *testing.T) {
	t.Parallel()
	for in, want := range map[string]string{
		"order-1042":                   "order-1042",
		"Zoë's café, 東京":               "Zoë's café, 東京",
		`C:\path`:                      `C:\path`,
		"a\tb\nc\rd":                   `a\tb\nc\rd`,
		"\x1b[31mred\x1b[0m":           `\x1b[31mred\x1b[0m`,
		"nul\x00 del\x7f":              `nul\x00 del\x7f`,
		"c1 \u0085 \u009b":             `c1 \u0085 \u009b`,
		"line\u2028para\u2029":         `line\u2028para\u2029`,
		"bad \xff\xfe utf8":            `bad \xff\xfe utf8`,
		"\u00a0no-break is visible":    "\u00a0no-break is visible",
		"abc\u202edcba\u202c":          `abc\u202edcba\u202c`,
		"\u2066iso\u2069 \u200f\u061c": `\u2066iso\u2069 \u200f\u061c`,
	} {
		require.Equal(t, want, Escape(in), "%q", in)
	}
}

func TestIsControl(t *testing.T) {
	t.Parallel()
	for _, r := range []rune{0, '\t', '\n', '\r', 0x1b, 0x1f, 0x7f, 0x80, 0x9b, 0x9f, 0x2028, 0x2029} {
		require.True(t, IsControl(r), "%U", r)
	}
	for _, r := range []rune{' ', '~', 0xa0, 'é', 0x2027, 0x202a, '東'} {
		require.False(t, IsControl(r), "%U", r)
	}
}
