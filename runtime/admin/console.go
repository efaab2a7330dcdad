package admin

import (
	"embed"
	"io/fs"
	"net/http"
)

// consoleFS holds the web console: plain HTML, CSS and JavaScript, no
// external resources (the content security policy allows only this origin).
//
//go:embed console/index.html console/console.css console/console.js
var consoleFS embed.FS

// consoleHandler serves the console's static files. They hold no data and
// need no token: the page asks for one and sends it with every API call.
func consoleHandler() http.Handler {
	sub, _ := fs.Sub(consoleFS, "console") // a constant directory of the embedded tree
	files := http.FileServerFS(sub)
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodGet && r.Method != http.MethodHead {
			w.Header().Set("Allow", "GET, HEAD")
			http.Error(w, "method not allowed", http.StatusMethodNotAllowed)
			return
		}
		switch r.URL.Path {
		case "/", "/console.css", "/console.js":
		default:
			http.NotFound(w, r)
			return
		}
		w.Header().Set("Cache-Control", "no-cache")
		files.ServeHTTP(w, r)
	})
}
