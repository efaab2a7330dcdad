package model

import "strings"

// suggest returns the candidate closest to name, for a "did you mean" in a
// finding about a misspelt reference, or "" when none is close: within an
// edit distance of a quarter of name's length (at least 1, at most 3),
// compared case-insensitively. A tie goes to the earlier candidate.
func suggest(name string, candidates []string) string {
	limit := min(max(len(name)/4, 1), 3)
	best, bestDist := "", limit+1
	for _, c := range candidates {
		if c == name {
			continue
		}
		if d := editDistance(strings.ToLower(name), strings.ToLower(c)); d < bestDist {
			best, bestDist = c, d
		}
	}
	return best
}

// editDistance is the Levenshtein distance between a and b, in bytes.
func editDistance(a, b string) int {
	prev := make([]int, len(b)+1)
	cur := make([]int, len(b)+1)
	for j := range prev {
		prev[j] = j
	}
	for i := 1; i <= len(a); i++ {
		cur[0] = i
		for j := 1; j <= len(b); j++ {
			cost := 1
			if a[i-1] == b[j-1] {
				cost = 0
			}
			cur[j] = min(prev[j]+1, cur[j-1]+1, prev[j-1]+cost)
		}
		prev, cur = cur, prev
	}
	return prev[len(b)]
}

// didYouMean prefixes hint with "did you mean %q? " when a candidate is
// close to name.
func didYouMean(name string, candidates []string, hint string) string {
	if s := suggest(name, candidates); s != "" {
		return `did you mean "` + s + `"? Otherwise ` + hint
	}
	return hint
}

// nameChoices lists the names a reference written as name could have
// meant, written the same way: full names when name has a '.', otherwise
// the names relative to pkg of the full names in it.
func nameChoices(name, pkg string, full []string) []string {
	name = strings.TrimPrefix(name, ".")
	var out []string
	for _, f := range full {
		switch {
		case strings.Contains(name, "."):
			out = append(out, f)
		case strings.HasPrefix(f, pkg+".") && !strings.Contains(f[len(pkg)+1:], "."):
			out = append(out, f[len(pkg)+1:])
		}
	}
	return out
}
