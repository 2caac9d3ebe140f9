package main

import (
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"

	"sigs.k8s.io/yaml"
)

// releasePath is where GitHub serves a release's files, below its host.
const releasePath = "/kubectl-migrate/kubectl-migrate/releases/download/"

// serveRelease serves, at http://ADDR/kubectl-migrate/kubectl-migrate/
// releases/download/TAG/NAME, the files a GitHub release made from dist
// would hold: the archives and checksums goreleaser uploads
// (dist/artifacts.json) and the release's extra_files (its effective
// config, dist/config.yaml). It listens before goreleaser runs, since the
// krew manifest's URLs name its address, so it reads dist at each request.
// The address goes to addrFile once listening.
func serveRelease(dist, addrFile string) error {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return err
	}
	root := filepath.Dir(dist)
	handler := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		rest, ok := strings.CutPrefix(r.URL.Path, releasePath)
		_, file, found := strings.Cut(rest, "/")
		if !ok || !found || strings.Contains(file, "/") {
			http.NotFound(w, r)
			return
		}
		files, err := releaseFiles(root, dist)
		if err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		path, ok := files[file]
		if !ok {
			http.NotFound(w, r)
			return
		}
		http.ServeFile(w, r, path)
	})
	if err := os.WriteFile(addrFile, []byte(ln.Addr().String()), 0o644); err != nil {
		return err
	}
	return http.Serve(ln, handler)
}

// releaseFiles maps each file name a release from dist would hold to its
// path.
func releaseFiles(root, dist string) (map[string]string, error) {
	files := map[string]string{}
	data, err := os.ReadFile(filepath.Join(dist, "artifacts.json"))
	if err != nil {
		return nil, err
	}
	var artifacts []struct{ Name, Path, Type string }
	if err := json.Unmarshal(data, &artifacts); err != nil {
		return nil, err
	}
	for _, a := range artifacts {
		if a.Type == "Archive" || a.Type == "Checksum" {
			files[a.Name] = filepath.Join(root, a.Path)
		}
	}
	data, err = os.ReadFile(filepath.Join(dist, "config.yaml"))
	if err != nil {
		return nil, err
	}
	var config struct {
		Release struct {
			ExtraFiles []struct {
				Glob         string `json:"glob"`
				NameTemplate string `json:"name_template"`
			} `json:"extra_files"`
		} `json:"release"`
	}
	if err := yaml.Unmarshal(data, &config); err != nil {
		return nil, err
	}
	for _, extra := range config.Release.ExtraFiles {
		if extra.NameTemplate != "" {
			return nil, fmt.Errorf("extra file %s: name_template is not served by this check", extra.Glob)
		}
		paths, err := filepath.Glob(filepath.Join(root, extra.Glob))
		if err != nil {
			return nil, err
		}
		for _, p := range paths {
			files[filepath.Base(p)] = p
		}
	}
	return files, nil
}
