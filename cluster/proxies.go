package cluster

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync"

	toxiproxy "github.com/Shopify/toxiproxy/v2"
	toxiclient "github.com/Shopify/toxiproxy/v2/client"
	"github.com/rs/zerolog"
)

// proxies is where a network's links run: toxiproxy's server in this
// process (the process environment), or a toxiproxy server in the docker
// environment's WAN container, driven through its HTTP API.
type proxies interface {
	// create starts the proxy name on listen (an address, port 0 for any)
	// to upstream, replacing a proxy of that name, and returns the address
	// it listens on.
	create(name, listen, upstream string) (string, error)
	// stop closes the proxy's listener and every open connection; start
	// listens again on the same address.
	stop(name string) error
	start(name string) error
	addToxic(name string, t Toxic) error
	// removeToxic fails with an error wrapping toxiproxy.ErrToxicNotFound
	// if the proxy has no such toxic.
	removeToxic(name, toxic string) error
	resetToxics(name string) error
	close()
}

// localProxies is toxiproxy's server running in this process.
type localProxies struct {
	srv *toxiproxy.ApiServer

	mu      sync.Mutex
	proxies map[string]*toxiproxy.Proxy
}

func newLocalProxies() *localProxies {
	return &localProxies{
		srv:     toxiproxy.NewServer(toxiproxy.NewMetricsContainer(nil), zerolog.Nop()),
		proxies: map[string]*toxiproxy.Proxy{},
	}
}

func (l *localProxies) get(name string) (*toxiproxy.Proxy, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	p, ok := l.proxies[name]
	if !ok {
		return nil, fmt.Errorf("cluster: no proxy %s", name)
	}
	return p, nil
}

func (l *localProxies) create(name, listen, upstream string) (string, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if _, ok := l.proxies[name]; ok {
		_ = l.srv.Collection.Remove(name) // stops it
	}
	p := toxiproxy.NewProxy(l.srv, name, listen, upstream)
	if err := l.srv.Collection.Add(p, true); err != nil {
		return "", fmt.Errorf("cluster: proxy %s: %w", name, err)
	}
	l.proxies[name] = p
	// Start has returned, so the listener has been bound and Listen holds
	// its address.
	return p.Listen, nil
}

func (l *localProxies) stop(name string) error {
	p, err := l.get(name)
	if err != nil {
		return err
	}
	p.Stop()
	return nil
}

func (l *localProxies) start(name string) error {
	p, err := l.get(name)
	if err != nil {
		return err
	}
	if err := p.Start(); err != nil && !errors.Is(err, toxiproxy.ErrProxyAlreadyStarted) {
		return err
	}
	return nil
}

func (l *localProxies) addToxic(name string, t Toxic) error {
	p, err := l.get(name)
	if err != nil {
		return err
	}
	b, err := json.Marshal(t)
	if err != nil {
		return fmt.Errorf("cluster: toxic: %w", err)
	}
	_, err = p.Toxics.AddToxicJson(bytes.NewReader(b))
	return err
}

func (l *localProxies) removeToxic(name, toxic string) error {
	p, err := l.get(name)
	if err != nil {
		return err
	}
	return p.Toxics.RemoveToxic(context.Background(), toxic)
}

func (l *localProxies) resetToxics(name string) error {
	p, err := l.get(name)
	if err != nil {
		return err
	}
	p.Toxics.ResetToxics(context.Background())
	return nil
}

func (l *localProxies) close() { _ = l.srv.Collection.Clear() }

// remoteProxies is a toxiproxy server in another network namespace (the
// docker environment's WAN container), driven through toxiproxy's own
// client.
type remoteProxies struct {
	client *toxiclient.Client

	mu      sync.Mutex
	proxies map[string]*toxiclient.Proxy
}

func newRemoteProxies(apiAddr string) *remoteProxies {
	return &remoteProxies{client: toxiclient.NewClient(apiAddr), proxies: map[string]*toxiclient.Proxy{}}
}

func (r *remoteProxies) get(name string) (*toxiclient.Proxy, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	p, ok := r.proxies[name]
	if !ok {
		return nil, fmt.Errorf("cluster: no proxy %s", name)
	}
	return p, nil
}

func (r *remoteProxies) create(name, listen, upstream string) (string, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if old, ok := r.proxies[name]; ok {
		if err := old.Delete(); err != nil {
			return "", fmt.Errorf("cluster: replace proxy %s: %w", name, err)
		}
		delete(r.proxies, name)
	}
	p, err := r.client.CreateProxy(name, listen, upstream)
	if err != nil {
		return "", fmt.Errorf("cluster: proxy %s on %s: %w", name, listen, err)
	}
	r.proxies[name] = p
	return p.Listen, nil
}

func (r *remoteProxies) stop(name string) error {
	p, err := r.get(name)
	if err != nil {
		return err
	}
	return p.Disable()
}

func (r *remoteProxies) start(name string) error {
	p, err := r.get(name)
	if err != nil {
		return err
	}
	return p.Enable()
}

func (r *remoteProxies) addToxic(name string, t Toxic) error {
	p, err := r.get(name)
	if err != nil {
		return err
	}
	_, err = p.AddToxic(t.Name, t.Type, t.Stream, t.Toxicity, toxiclient.Attributes(t.Attributes))
	return err
}

func (r *remoteProxies) removeToxic(name, toxic string) error {
	p, err := r.get(name)
	if err != nil {
		return err
	}
	if err := p.RemoveToxic(toxic); err != nil {
		// The server answers 404 "toxic not found".
		if strings.Contains(err.Error(), "not found") {
			return fmt.Errorf("cluster: %s: %w", name, toxiproxy.ErrToxicNotFound)
		}
		return err
	}
	return nil
}

func (r *remoteProxies) resetToxics(name string) error {
	p, err := r.get(name)
	if err != nil {
		return err
	}
	toxics, err := p.Toxics()
	if err != nil {
		return err
	}
	var errs []error
	for _, t := range toxics {
		if err := p.RemoveToxic(t.Name); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// close does nothing: the WAN container goes with the cluster.
func (r *remoteProxies) close() {}
