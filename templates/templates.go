// Package templates embeds the text/template files the generator renders
// non-Go artifacts from: SQL migrations, the saga documentation page and its
// BPMN 2.0 process. Keeping them as files (not Go strings) lets a
// reviewer read the output's shape directly.
package templates

import (
	"embed"
	"text/template"
)

//go:embed *.tmpl
var files embed.FS

// Parse parses every template with funcs available to them.
func Parse(funcs template.FuncMap) (*template.Template, error) {
	return template.New("templates").Funcs(funcs).ParseFS(files, "*.tmpl")
}
