package syncapp

import (
	"go/ast"
	"go/parser"
	"go/token"
	"go/types"
	"path"
	"path/filepath"
	"strings"
	"testing"
)

// TestOneOwnerPerState holds the shape of the package (see doc.go): each
// piece of a namespace's fleet state has one owner, a request goes from
// the Namespace to an owner and on to the store, and nothing comes back.
//
//   - No method of another type takes a *Namespace and calls into it: an
//     owner that needs the namespace's zone or store gets the part it
//     needs, or hands the work back in its results.
//   - No expression reaches through two fields into another type's state
//     (n.outbox.retries.items): each owner is changed through its methods.
//
// It reads the package's own source; imports are not resolved, so only
// what the package declares is checked, which is all these rules are
// about.
func TestOneOwnerPerState(t *testing.T) {
	fset := token.NewFileSet()
	files, err := filepath.Glob("*.go")
	if err != nil {
		t.Fatal(err)
	}
	var parsed []*ast.File
	for _, name := range files {
		if strings.HasSuffix(name, "_test.go") {
			continue
		}
		f, err := parser.ParseFile(fset, name, nil, 0)
		if err != nil {
			t.Fatal(err)
		}
		parsed = append(parsed, f)
	}
	info := &types.Info{Selections: make(map[*ast.SelectorExpr]*types.Selection)}
	conf := types.Config{
		Importer: fakeImporter{},
		Error:    func(error) {}, // the imports are empty: their names do not resolve
	}
	pkg, _ := conf.Check("syncapp", fset, parsed, info)
	checkCallsIntoNamespace(t, fset, parsed, info)

	for _, f := range parsed {
		for _, decl := range f.Decls {
			fn, ok := decl.(*ast.FuncDecl)
			if !ok || fn.Body == nil {
				continue
			}
			recv := receiverName(fn)
			if recv != "" && recv != "Namespace" {
				for _, p := range namespaceParams(fn) {
					ast.Inspect(fn.Body, func(n ast.Node) bool {
						if call, ok := n.(*ast.CallExpr); ok && rootIdent(call.Fun) == p {
							t.Errorf("%s: %s.%s takes a *Namespace (%s) and calls back into it", fset.Position(call.Pos()), recv, fn.Name.Name, p)
						}
						return true
					})
				}
			}
			ast.Inspect(fn.Body, func(n ast.Node) bool {
				sel, ok := n.(*ast.SelectorExpr)
				if !ok {
					return true
				}
				inner, ok := sel.X.(*ast.SelectorExpr)
				if !ok || !isField(info, sel) || !isField(info, inner) {
					return true
				}
				owner := ownerName(pkg, info.Selections[sel].Recv())
				if owner != "" && owner != recv {
					t.Errorf("%s: %s reaches through two fields into the state of %s", fset.Position(sel.Pos()), types.ExprString(sel), owner)
				}
				return true
			})
		}
	}
}

// drivers are the types whose methods may call the Namespace, and why: the
// loop drives the runs of the namespace attached (it is where a run
// starts, as a request is where a hit starts), and the fleet state reads
// the attached namespace's pending diffs for the metrics. Every other
// part of the fleet state (health, outbox, fetchSet, banTable, slotHolder,
// inFlight, hitQueue, ...) is called by the Namespace and never calls it,
// whether it holds a *Namespace as a parameter, a field, or the result
// of a call.
var drivers = map[string]string{
	"Namespace":  "itself",
	"App":        "the config that made its namespaces",
	"AdminAPI":   "the admin API, above the namespaces",
	"loop":       "drives the runs of the namespace attached",
	"fleetState": "reads the attached namespace's pending diffs for the metrics",
}

// checkCallsIntoNamespace fails t for every call of a method of Namespace
// made in a method of a type that is not a driver.
func checkCallsIntoNamespace(t *testing.T, fset *token.FileSet, files []*ast.File, info *types.Info) {
	t.Helper()
	for _, f := range files {
		for _, decl := range f.Decls {
			fn, ok := decl.(*ast.FuncDecl)
			if !ok || fn.Body == nil {
				continue
			}
			recv := receiverName(fn)
			if _, ok := drivers[recv]; ok || recv == "" {
				continue
			}
			ast.Inspect(fn.Body, func(n ast.Node) bool {
				sel, ok := n.(*ast.SelectorExpr)
				if !ok {
					return true
				}
				if s, ok := info.Selections[sel]; ok && s.Kind() == types.MethodVal && ownerName(s.Obj().Pkg(), s.Recv()) == "Namespace" {
					t.Errorf("%s: %s.%s calls back into the Namespace (%s)", fset.Position(sel.Pos()), recv, fn.Name.Name, types.ExprString(sel))
				}
				return true
			})
		}
	}
}

func isField(info *types.Info, sel *ast.SelectorExpr) bool {
	s, ok := info.Selections[sel]
	return ok && s.Kind() == types.FieldVal
}

// ownerName returns the name of the type declared in pkg whose field a
// selection reads, or "" for types of other packages.
func ownerName(pkg *types.Package, t types.Type) string {
	if p, ok := t.(*types.Pointer); ok {
		t = p.Elem()
	}
	if n, ok := t.(*types.Named); ok && n.Obj().Pkg() == pkg {
		return n.Obj().Name()
	}
	return ""
}

func receiverName(fn *ast.FuncDecl) string {
	if fn.Recv == nil || len(fn.Recv.List) == 0 {
		return ""
	}
	t := fn.Recv.List[0].Type
	if s, ok := t.(*ast.StarExpr); ok {
		t = s.X
	}
	if id, ok := t.(*ast.Ident); ok {
		return id.Name
	}
	return ""
}

// namespaceParams returns the names of fn's parameters of type *Namespace.
func namespaceParams(fn *ast.FuncDecl) []string {
	var names []string
	for _, field := range fn.Type.Params.List {
		s, ok := field.Type.(*ast.StarExpr)
		if !ok {
			continue
		}
		if id, ok := s.X.(*ast.Ident); ok && id.Name == "Namespace" {
			for _, n := range field.Names {
				names = append(names, n.Name)
			}
		}
	}
	return names
}

// rootIdent returns the name at the root of a selector chain (p in
// p.a.b), or "".
func rootIdent(e ast.Expr) string {
	for {
		switch x := e.(type) {
		case *ast.SelectorExpr:
			e = x.X
		case *ast.Ident:
			return x.Name
		default:
			return ""
		}
	}
}

// fakeImporter gives every import as an empty package.
type fakeImporter struct{}

func (fakeImporter) Import(p string) (*types.Package, error) {
	pkg := types.NewPackage(p, path.Base(p))
	pkg.MarkComplete()
	return pkg, nil
}
