package region

import (
	"mime"
	"net/http"

	"github.com/idemcoord/idem"
	"github.com/idemcoord/idem/coordapi"
	"github.com/idemcoord/idem/internal/strictjson"
)

func coordResponseOf(r *idem.Response) *coordapi.Response {
	if r == nil {
		return nil
	}
	out := &coordapi.Response{Status: r.Status, Headers: r.Headers, Body: r.Body, SchemaVersion: r.SchemaVersion}
	if out.Headers == nil {
		out.Headers = map[string]string{}
	}
	if out.Body == nil {
		out.Body = []byte{}
	}
	return out
}

// decodeCoordBody reads one JSON object of at most MaxBodyBytes into dst
// with package strictjson: exact member names, no duplicates, valid UTF-8,
// bounded depth, nothing after the object, no unknown members.
func (s *Server) decodeCoordBody(w http.ResponseWriter, r *http.Request, dst any) error {
	if ct := r.Header.Get("Content-Type"); ct != "" {
		if mt, _, err := mime.ParseMediaType(ct); err != nil || mt != "application/json" {
			return idem.Errorf(idem.ECodeUnsupportedMediaType, "The body must be application/json.")
		}
	}
	body, err := s.readBody(w, r)
	if err != nil {
		return err
	}
	return strictjson.ClientError(strictjson.DecodeObject(body, dst))
}
