// Package report aggregates repeated benchmark measurements into medians with
// min–max and prints them as one Markdown table.
package report

import (
	"fmt"
	"io"
	"math"
	"slices"
	"strings"
)

// Metric is one number a measurement produced.
type Metric struct {
	Name  string // e.g. "sagas/s"
	Value float64
}

// Row is every value of one (measurement, metric) pair across runs.
type Row struct {
	Group, Measurement, Metric string
	Values                     []float64
}

// Median of the values (NaN when there are none).
func (r *Row) Median() float64 { return median(r.Values) }

// Min and Max of the values.
func (r *Row) Min() float64 { return slices.Min(r.Values) }

// Max of the values.
func (r *Row) Max() float64 { return slices.Max(r.Values) }

func median(v []float64) float64 {
	if len(v) == 0 {
		return math.NaN()
	}
	s := slices.Clone(v)
	slices.Sort(s)
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}

// Table collects rows in first-seen order.
type Table struct {
	rows  []*Row
	index map[string]*Row
	notes []string
}

// Add records one run's metrics of a measurement.
func (t *Table) Add(group, measurement string, ms ...Metric) {
	if t.index == nil {
		t.index = map[string]*Row{}
	}
	for _, m := range ms {
		if math.IsNaN(m.Value) || math.IsInf(m.Value, 0) {
			continue
		}
		k := measurement + "\x00" + m.Name
		r := t.index[k]
		if r == nil {
			r = &Row{Group: group, Measurement: measurement, Metric: m.Name}
			t.index[k] = r
			t.rows = append(t.rows, r)
		}
		r.Values = append(r.Values, m.Value)
	}
}

// Get returns the row of (measurement, metric), or nil.
func (t *Table) Get(measurement, metric string) *Row {
	return t.index[measurement+"\x00"+metric]
}

// Median returns the median of (measurement, metric), NaN when absent.
func (t *Table) Median(measurement, metric string) float64 {
	if r := t.Get(measurement, metric); r != nil {
		return r.Median()
	}
	return math.NaN()
}

// Note adds a line printed under the table.
func (t *Table) Note(format string, args ...any) {
	t.notes = append(t.notes, fmt.Sprintf(format, args...))
}

// Format renders a value with a precision that suits its size.
func Format(v float64) string {
	a := math.Abs(v)
	switch {
	case math.IsNaN(v):
		return "—"
	case a >= 1000:
		return fmt.Sprintf("%.0f", v)
	case a >= 100:
		return fmt.Sprintf("%.0f", v)
	case a >= 10:
		return fmt.Sprintf("%.1f", v)
	case a >= 1:
		return fmt.Sprintf("%.2f", v)
	default:
		return fmt.Sprintf("%.3f", v)
	}
}

// Print writes the table as Markdown.
func (t *Table) Print(w io.Writer) {
	fmt.Fprintln(w, "| group | measurement | metric | median | min–max | runs |")
	fmt.Fprintln(w, "|---|---|---|---:|---|---:|")
	for _, r := range t.rows {
		rng := Format(r.Min()) + "–" + Format(r.Max())
		if len(r.Values) == 1 {
			rng = ""
		}
		fmt.Fprintf(w, "| %s | %s | %s | %s | %s | %d |\n", r.Group, r.Measurement, r.Metric, Format(r.Median()), rng, len(r.Values))
	}
	if len(t.notes) > 0 {
		fmt.Fprintln(w)
		for _, n := range t.notes {
			fmt.Fprintln(w, "- "+strings.TrimSpace(n))
		}
	}
}
