package accuracy

import (
	"bytes"
	"encoding/xml"
	"io"
	"strings"
	"testing"
	"time"
)

func TestPlotSVG(t *testing.T) {
	var pts []Point
	for w := range 2 {
		for n := 1; n <= 220; n++ {
			pts = append(pts, Point{T: time.Duration(w)*time.Second + time.Duration(n)*time.Millisecond, Admitted: n})
		}
	}
	p := Plot{
		Title:  "a <plot> & more",
		Limit:  200,
		Length: 2 * time.Second,
		Series: []PlotSeries{{Label: "sync_rate 0", Points: pts[:200]}, {Label: "100ms, sync_above off", Points: pts}},
	}
	svg := p.SVG()

	// Well-formed XML, every tag closed, the title escaped.
	dec := xml.NewDecoder(bytes.NewReader(svg))
	paths := 0
	for {
		tok, err := dec.Token()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatalf("not well-formed XML: %v\n%s", err, svg)
		}
		if se, ok := tok.(xml.StartElement); ok && se.Name.Local == "path" {
			paths++
		}
	}
	if paths != 2 {
		t.Errorf("%d paths, want one per series", paths)
	}
	for _, want := range []string{"a &lt;plot&gt; &amp; more", "limit 200", "100ms, sync_above off", "stroke-dasharray"} {
		if !bytes.Contains(svg, []byte(want)) {
			t.Errorf("the SVG lacks %q", want)
		}
	}
	// The second series climbs past the limit in both windows and falls
	// back to 0 between them.
	if n := strings.Count(string(svg), "M"); n < 3 {
		t.Errorf("%d moves in the paths, want a new start per window", n)
	}
}

func TestThin(t *testing.T) {
	var pts []Point
	for n := 1; n <= 1000; n++ {
		pts = append(pts, Point{T: time.Duration(n), Admitted: n})
	}
	out := thin(pts, 100)
	if len(out) > 101 || out[len(out)-1].Admitted != 1000 {
		t.Errorf("thin: %d points, last %+v; want at most 101, ending at the peak", len(out), out[len(out)-1])
	}
	if got := thin(pts[:50], 100); len(got) != 50 {
		t.Errorf("thin of few points dropped some: %d", len(got))
	}
}

func TestNiceStep(t *testing.T) {
	for _, tc := range []struct{ in, want float64 }{{0.3, 0.5}, {7, 10}, {43, 50}, {120, 200}, {1, 1}} {
		if got := niceStep(tc.in); got != tc.want {
			t.Errorf("niceStep(%v) = %v, want %v", tc.in, got, tc.want)
		}
	}
}
