package migratetest

import (
	"context"
	"errors"

	"github.com/kubectl-migrate/kubectl-migrate/pkg/report"
)

// The world's registry.

type fakeRegistry World

func (f *fakeRegistry) CheckPush(context.Context, string) error {
	return (*World)(f).fail(report.Preflight)
}

func (f *fakeRegistry) Delete(_ context.Context, ref string) error {
	w := (*World)(f)
	w.record("delete image %s", ref)
	w.Mu.Lock()
	defer w.Mu.Unlock()
	if w.RegistryDown {
		return errors.New("dial tcp registry:5000: connection refused")
	}
	delete(w.Images, ref)
	return nil
}
