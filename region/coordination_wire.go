package region

import (
	"mime"
	"net/http"

	"github.com/go-json-experiment/json/jsontext"

	"github.com/idemcoord/idem"
	"github.com/idemcoord/idem/internal/strictjson"
)

// coordResponse is a stored response on the wire; Body is base64 (standard
// alphabet, padded), as encoding/json writes []byte.
type coordResponse struct {
	Status        int               `json:"status"`
	Headers       map[string]string `json:"headers"`
	Body          []byte            `json:"body"`
	SchemaVersion string            `json:"schemaVersion"`
}

func coordResponseOf(r *idem.Response) *coordResponse {
	if r == nil {
		return nil
	}
	out := &coordResponse{Status: r.Status, Headers: r.Headers, Body: r.Body, SchemaVersion: r.SchemaVersion}
	if out.Headers == nil {
		out.Headers = map[string]string{}
	}
	if out.Body == nil {
		out.Body = []byte{}
	}
	return out
}

type beginInput struct {
	RequestHash        *string        `json:"requestHash"`
	Command            jsontext.Value `json:"command"`
	LockTimeoutSeconds *int64         `json:"lockTimeoutSeconds"`
	WindowSeconds      *int64         `json:"windowSeconds"`
	Owner              *string        `json:"owner"`
}

type beginOutput struct {
	Outcome string `json:"outcome"`
	// FencingToken is set when the caller now owns the record.
	FencingToken int64          `json:"fencingToken,omitempty"`
	Record       recordView     `json:"record"`
	Response     *coordResponse `json:"response,omitempty"`
	ExpiredRetry bool           `json:"expiredRetry"`
}

type recordOutput struct {
	Record   recordView     `json:"record"`
	Response *coordResponse `json:"response,omitempty"`
}

type responseInput struct {
	Status        *int              `json:"status"`
	Headers       map[string]string `json:"headers"`
	Body          []byte            `json:"body"`
	SchemaVersion string            `json:"schemaVersion"`
}

type checkpointInput struct {
	FencingToken *int64  `json:"fencingToken"`
	Checkpoint   *string `json:"checkpoint"`
}

type completeInput struct {
	FencingToken *int64         `json:"fencingToken"`
	Response     *responseInput `json:"response"`
	ResourceType string         `json:"resourceType"`
	ResourceID   string         `json:"resourceId"`
}

type failInput struct {
	FencingToken *int64         `json:"fencingToken"`
	Status       *string        `json:"status"`
	ErrorCode    string         `json:"errorCode"`
	Response     *responseInput `json:"response"`
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
