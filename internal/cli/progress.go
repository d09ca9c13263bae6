package cli

import (
	"fmt"
	"io"
	"time"

	"github.com/schollz/progressbar/v3"

	v1 "github.com/k7-dev/k7/api/v1"
)

// progressView shows the PullProgress stream of a pull or import on w: a
// progress bar when w is a terminal, one line per status change otherwise.
type progressView struct {
	w    io.Writer
	tty  bool
	bar  *progressbar.ProgressBar
	last string
}

func newProgressView(w io.Writer) *progressView {
	_, tty := terminalFd(w)
	return &progressView{w: w, tty: tty}
}

// update shows one report. Error reports are left to the caller.
func (p *progressView) update(pp v1.PullProgress) {
	if pp.Error != "" || pp.Image != nil {
		return
	}
	if !p.tty {
		if pp.Status != "" && pp.Status != p.last {
			if pp.TotalBytes > 0 {
				fmt.Fprintf(p.w, "%s (%s)\n", pp.Status, humanBytes(pp.TotalBytes))
			} else {
				fmt.Fprintln(p.w, pp.Status)
			}
			p.last = pp.Status
		}
		return
	}
	if pp.TotalBytes <= 0 {
		if pp.Status != "" && pp.Status != p.last {
			p.clear()
			fmt.Fprintln(p.w, pp.Status)
			p.last = pp.Status
		}
		return
	}
	if p.bar == nil {
		p.bar = progressbar.NewOptions64(pp.TotalBytes,
			progressbar.OptionSetWriter(p.w),
			progressbar.OptionShowBytes(true),
			progressbar.OptionSetWidth(30),
			progressbar.OptionThrottle(100*time.Millisecond),
			progressbar.OptionClearOnFinish(),
			progressbar.OptionSetDescription(pp.Status),
		)
	} else if pp.TotalBytes != p.bar.GetMax64() {
		p.bar.ChangeMax64(pp.TotalBytes)
	}
	if pp.Status != p.last {
		p.bar.Describe(pp.Status)
		p.last = pp.Status
	}
	_ = p.bar.Set64(pp.DoneBytes)
}

// clear removes the bar, if any.
func (p *progressView) clear() {
	if p.bar != nil {
		_ = p.bar.Finish()
		_ = p.bar.Clear()
		p.bar = nil
	}
}

// done ends the display with a final line.
func (p *progressView) done(img *v1.Image, verb string) {
	p.clear()
	ref := ""
	if len(img.Refs) > 0 {
		ref = img.Refs[0] + " "
	}
	fmt.Fprintf(p.w, "%s %s(%s, %s)\n", verb, ref, shortID(img.ID), humanBytes(img.SizeBytes))
}
