package gen

import (
	"bytes"
	"go/scanner"
	"go/token"
	"go/types"
	"path"
	"regexp"
	"slices"
	"strconv"
	"strings"

	"google.golang.org/protobuf/compiler/protogen"
)

// versionName is an import name that is only a major version, as protogen
// names imports after their path's last element: "v5" for
// github.com/jackc/pgx/v5, "v1", "v12" for …/shop/payment/v1.
var versionName = regexp.MustCompile(`^v[0-9]+$`)

// packageNames maps the import paths of the request's Go packages to the
// names their go_package gives them ("orderv1").
func packageNames(plugin *protogen.Plugin) map[string]string {
	names := map[string]string{}
	for _, f := range plugin.Files {
		names[string(f.GoImportPath)] = string(f.GoPackageName)
	}
	return names
}

// readableImports renames, in the Go source src (formatted by protogen),
// the imports named only by a major version to what a reader knows them by:
// the package's own name when the request declares it (names, see
// packageNames), otherwise the path element before the version ("pgx").
//
// It works on tokens and splices the new names in at their offsets, so the
// file is neither parsed nor formatted again (a second formatting pass would
// cost more than the rest of the generation). A
// reference is an identifier followed by "." and not preceded by one; an
// import whose old name also appears any other way (a local variable named
// like it) is left alone, as is one whose new name is taken by any
// identifier in the file, another import, a keyword or a predeclared name.
// src is returned unchanged when nothing is renamed.
func readableImports(src []byte, names map[string]string) []byte {
	fset := token.NewFileSet()
	file := fset.AddFile("", fset.Base(), len(src))
	var s scanner.Scanner
	failed := false
	s.Init(file, src, func(token.Position, string) { failed = true }, 0)

	// The package clause and the import declarations come first.
	type spec struct {
		nameOff         int
		old, want, path string
		refs            []int // offsets of "old." references
		keep            bool  // old appears other than as a qualifier, or want is taken
	}
	var (
		specs    []*spec
		pkgName  string
		pos      token.Pos
		tok      token.Token
		lit      string
		nameOff  = -1
		specName string
		imported = map[string]bool{} // every import's name
	)
	next := func() { pos, tok, lit = s.Scan() }
	next()
	if tok != token.PACKAGE {
		return src
	}
	next()
	pkgName = lit
	next()
	for ; tok == token.SEMICOLON || tok == token.IMPORT; next() {
		if tok == token.SEMICOLON {
			continue
		}
		next()
		block := tok == token.LPAREN
		if block {
			next()
		}
		for done := false; !done && tok != token.EOF; {
			switch tok {
			case token.RPAREN:
				done = block
			case token.IDENT:
				specName, nameOff = lit, file.Offset(pos)
				imported[lit] = true
			case token.STRING:
				if p, err := strconv.Unquote(lit); err == nil && specName != "" && versionName.MatchString(specName) {
					specs = append(specs, &spec{nameOff: nameOff, old: specName, path: p})
				}
				specName = ""
				done = !block
			}
			if !done {
				next()
			}
		}
	}
	if len(specs) == 0 || failed {
		return src
	}
	wants := map[string]*spec{}
	olds := map[string]*spec{}
	for _, sp := range specs {
		want := names[sp.path]
		if want == "" || versionName.MatchString(want) {
			want = strings.NewReplacer("-", "_", ".", "_").Replace(path.Base(path.Dir(sp.path)))
		}
		if !token.IsIdentifier(want) || token.IsKeyword(want) || want == "_" || want == "init" ||
			types.Universe.Lookup(want) != nil || want == pkgName || imported[want] || wants[want] != nil {
			continue
		}
		sp.want = want
		wants[want] = sp
		olds[sp.old] = sp
	}
	// The rest of the file: is a wanted name taken, and where is each old
	// name used as a qualifier ("v1." not after a ".")?
	prev := token.ILLEGAL
	var pending *spec // an old name just seen, waiting for its next token
	pendingOff := 0
	for ; tok != token.EOF; next() {
		if pending != nil {
			if tok == token.PERIOD {
				pending.refs = append(pending.refs, pendingOff)
			} else {
				pending.keep = true
			}
			pending = nil
		}
		if tok == token.IDENT {
			if sp := wants[lit]; sp != nil {
				sp.keep = true // taken by an identifier of the file
			}
			if sp := olds[lit]; sp != nil {
				if prev == token.PERIOD {
					sp.keep = true
				} else {
					pending, pendingOff = sp, file.Offset(pos)
				}
			}
		}
		prev = tok
	}
	if pending != nil {
		pending.keep = true
	}
	if failed {
		return src
	}
	type edit struct {
		off       int
		old, name string
	}
	var edits []edit
	for _, sp := range specs {
		if sp.want == "" || sp.keep {
			continue
		}
		edits = append(edits, edit{sp.nameOff, sp.old, sp.want})
		for _, off := range sp.refs {
			edits = append(edits, edit{off, sp.old, sp.want})
		}
	}
	if len(edits) == 0 {
		return src
	}
	slices.SortFunc(edits, func(a, b edit) int { return a.off - b.off })
	var out bytes.Buffer
	out.Grow(len(src) + 8*len(edits))
	last := 0
	for _, e := range edits {
		out.Write(src[last:e.off])
		out.WriteString(e.name)
		last = e.off + len(e.old)
	}
	out.Write(src[last:])
	return out.Bytes()
}
